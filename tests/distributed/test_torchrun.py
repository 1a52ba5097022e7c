"""The multi-host path on one host: every rank started by torchrun (env:// rendezvous), rank 0 schedules
and prints, rank 1 runs the worker loop; the answer equals one process's. What counts as torchrun's
environment, and a torchrun of the wrong size."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tp_helpers import completions, make_llm

from pagedllm import SamplingParams
from pagedllm.distributed.group import RankGroup
from pagedllm.errors import InvalidInputError

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


def test_master_addr_and_port_alone_are_not_torchrun(tiny_llama_dir, monkeypatch) -> None:
    """All four of torchrun's variables, not a MASTER_ADDR / MASTER_PORT another launcher left: the engine spawns
    its own workers instead of waiting for ranks nobody starts."""
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29511")
    llm = make_llm(tiny_llama_dir, 2)
    try:
        assert llm.engine.executor.workers is not None
        assert completions(llm, ["Hello"], SamplingParams(temperature=0.0, max_tokens=4))[0][0][0]
    finally:
        llm.engine.shutdown()


def test_torchrun_of_another_size_is_refused_before_joining(tiny_llama_dir, monkeypatch) -> None:
    """Joining would wait for ranks that never come (env:// rendezvous, 30 minutes by default)."""
    monkeypatch.setattr(RankGroup, "join", lambda *args, **kwargs: pytest.fail("joined a group of the wrong size"))
    for name, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInputError, match="tensor_parallel_size is 2 but torchrun started 3 processes"):
        make_llm(tiny_llama_dir, 2)
