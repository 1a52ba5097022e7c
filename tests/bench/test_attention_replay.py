"""attention_replay runs a workload with every attention call made by each build, and reports both."""

import re

import pytest

from pagedllm.bench import attention_replay
from pagedllm.kernels import load_cpu_kernels


@pytest.mark.skipif(load_cpu_kernels() is None, reason="no compiled kernels on this machine")
def test_replay_times_every_call_with_each_build(tiny_llama_dir, capsys: pytest.CaptureFixture[str]) -> None:
    build = load_cpu_kernels().__file__
    args = [build, build, "--model", str(tiny_llama_dir), "--num-requests", "3", "--no-progress"]
    assert attention_replay.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    pattern = r"(decode|with prompt tokens) +(\d+) calls +A +(\d+\.\d+) s +B +(\d+\.\d+) s"
    rows = {m.group(1): m for line in lines if (m := re.fullmatch(pattern, line))}
    assert set(rows) == {"decode", "with prompt tokens"}
    assert all(int(m.group(2)) > 0 and float(m.group(3)) >= 0 for m in rows.values())
