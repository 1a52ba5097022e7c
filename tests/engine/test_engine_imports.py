"""The engine path runs for real on the CPU with triton and the server's and GGUF's packages made
unimportable (as on the GPU machine of scripts/gpu_check.sh, which lacks fastapi, uvicorn, pydantic,
gguf and openai; and as on a CPU machine without triton)."""

import subprocess
import sys

CODE = """
import sys
for name in ("triton", "fastapi", "starlette", "uvicorn", "pydantic", "gguf", "openai"):
    sys.modules[name] = None  # `import name` now raises ImportError, as if it were not installed
import pagedllm, pagedllm.engine.cuda_graphs, pagedllm.engine.pool_sizing, pagedllm.bench.throughput
from pagedllm.entrypoints.cli import build_parser

assert build_parser().parse_args(["bench", "throughput", "--model", sys.argv[1]]).workload == "mixed"
from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.sampling_params import SamplingParams

engine = LLMEngine(EngineConfig(model=sys.argv[1], device="cpu", num_blocks=32, block_size=4))
engine.add_request(None, [5, 6, 7], SamplingParams(max_tokens=3, temperature=0.8, seed=1))
while engine.has_unfinished_requests():
    engine.step()
print("ran", engine.generation_tokens_total)
"""


def test_engine_runs_without_triton_and_the_server_packages(tiny_llama_dir):
    result = subprocess.run([sys.executable, "-c", CODE, str(tiny_llama_dir)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "ran 3"
