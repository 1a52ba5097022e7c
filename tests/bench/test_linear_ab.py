"""linear_ab runs both matmuls on the model's shapes and prints one line per batch of rows."""

import re

import pytest
import torch

from pagedllm.bench import linear_ab
from pagedllm.kernels import load_cpu_kernels
from pagedllm.model.projection import amx_matmul_kernels, linear_kernels


@pytest.mark.skipif(linear_kernels(torch.float32) is None, reason="no compiled linear kernel here (needs AVX-512 or AVX2)")
def test_linear_ab_prints_both_rates(capsys: pytest.CaptureFixture[str]) -> None:
    assert linear_ab.main(["--layers", "1", "--rows", "3", "--repeats", "1", "--threads", "1"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    match = re.fullmatch(r"rows +3 +oneDNN +(\d+) +pagedllm +(\d+) +x\d+\.\d\d", line)
    assert match and all(int(rate) > 0 for rate in match.groups())


@pytest.mark.skipif(linear_kernels(torch.float32) is None, reason="no compiled linear kernel here (needs AVX-512 or AVX2)")
def test_linear_ab_compares_builds(capsys: pytest.CaptureFixture[str]) -> None:
    build = load_cpu_kernels().__file__
    args = ["--builds", build, build, "--layers", "1", "--rows", "3", "--repeats", "1", "--threads", "1"]
    assert linear_ab.main(args) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    match = re.fullmatch(r"rows +3 +(\d+\.\d) +(\d+\.\d)", line)
    assert match and all(float(rate) > 0 for rate in match.groups())


@pytest.mark.skipif(amx_matmul_kernels() is None, reason="no AMX matmul here (it needs a CPU with AMX-BF16)")
def test_linear_ab_adds_the_amx_matmul_in_bfloat16(capsys: pytest.CaptureFixture[str]) -> None:
    assert linear_ab.main(["--dtype", "bfloat16", "--layers", "1", "--rows", "3", "--repeats", "1", "--threads", "1"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    match = re.fullmatch(r"rows +3 +oneDNN +(\d+) +pagedllm +(\d+) +x\d+\.\d\d +pagedllm AMX +(\d+) +x\d+\.\d\d", line)
    assert match and all(int(rate) > 0 for rate in match.groups())
