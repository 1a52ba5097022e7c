"""stack_ab replays one captured decode step through each build's decoder stack."""

import re
from pathlib import Path

import pytest
from compiled_kernels import require_compiled_kernels

from pagedllm.bench import stack_ab


def test_stack_ab_prints_a_time_per_build(tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build = require_compiled_kernels().__file__
    args = [build, build, "--at", "2", "--reps", "1", "--model", str(tiny_llama_dir), "--workload", "mixed",
            "--num-requests", "3", "--dtype", "float32", "--no-progress"]  # fmt: skip
    assert stack_ab.main(args) == 0
    lines = capsys.readouterr().out.splitlines()[-2:]
    for i, line in enumerate(lines):
        match = re.fullmatch(rf"  {i} {re.escape(Path(build).name)} +(\d+\.\d\d) +(\d+\.\d\d)", line)
        assert match and all(float(ms) > 0 for ms in match.groups())


def test_stack_ab_says_when_the_run_is_too_short(tiny_llama_dir: Path) -> None:
    build = require_compiled_kernels().__file__
    args = [build, "--at", "100000", "--reps", "1", "--model", str(tiny_llama_dir), "--workload", "mixed",
            "--num-requests", "2", "--dtype", "float32", "--no-progress"]  # fmt: skip
    with pytest.raises(SystemExit, match="lower --at"):
        stack_ab.main(args)
