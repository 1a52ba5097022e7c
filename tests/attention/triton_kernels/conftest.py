"""The Triton kernel tests run under the Triton interpreter on CPU tensors, or compiled on CUDA when
PAGEDLLM_TRITON_DEVICE=cuda (scripts/gpu_check.sh).

@triton.jit chooses interpreted or compiled (TRITON_INTERPRET=1) when a function is defined: triton's own
library (tl.zeros, tl.max, ...) when triton.language is first imported, pagedllm's kernels when they are
first used (pagedllm/attention/triton/loader.py). So this file imports triton under the variable and puts
the variable back, and each test here sets it again only while it runs; the other tests never see it.
(triton's library then stays interpreted for the session: no other test runs triton code on the CPU.)
The folder is not named "triton": on sys.path it would shadow a missing triton package.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent))  # attn_helpers

DEVICE = os.environ.get("PAGEDLLM_TRITON_DEVICE", "cpu")


def import_triton_interpreted() -> None:
    if DEVICE != "cpu" or "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


import_triton_interpreted()


@pytest.fixture(autouse=True)
def triton_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    tl = pytest.importorskip("triton.language")
    if DEVICE != "cpu":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        return
    if type(tl.zeros).__name__ != "InterpretedFunction":
        pytest.fail(
            "triton was imported before these tests could load it under TRITON_INTERPRET=1 (something "
            "collected earlier imported it); run tests/attention/triton_kernels on its own or first"
        )
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    if DEVICE != "cpu" and not torch.cuda.is_available():
        pytest.fail(f"PAGEDLLM_TRITON_DEVICE={DEVICE} but torch sees no CUDA device")
    return torch.device(DEVICE)
