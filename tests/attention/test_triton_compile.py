"""The Triton kernels compile for a CUDA GPU (sm_90) as the launchers call them: checked on the CPU, so
code that only the interpreter accepts is caught without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_kernels_compile_for_cuda() -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).parent / "triton_cuda_compile.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    # 5 kernels x 2 dtypes x 2 shapes, and the merge again with a CUDA graph's 32 splits
    assert result.stdout.count("compiled") == 24, result.stdout
