"""The multi-host path on one host: every rank started by torchrun (env:// rendezvous), rank 0 schedules
and prints, rank 1 runs the worker loop; the answer equals one process's."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def generate(model: Path, *launcher: str, size: int = 1) -> subprocess.CompletedProcess:
    args = [*launcher, "-m", "pagedllm", "generate", "--model", str(model), "--tensor-parallel-size", str(size),
            "--dtype", "float32", "--num-blocks", "64", "--block-size", "4", "--max-tokens", "12",
            "PagedAttention stores"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_with_two_ranks_answers_as_one_process(tiny_llama_dir) -> None:
    single = generate(tiny_llama_dir, sys.executable)
    assert single.returncode == 0, single.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    ranks = generate(tiny_llama_dir, *torchrun, size=2)
    assert ranks.returncode == 0, ranks.stderr[:6000]
    assert ranks.stdout == single.stdout and single.stdout.strip()
    assert "tensor parallel: 2 ranks (gloo)" in ranks.stderr
