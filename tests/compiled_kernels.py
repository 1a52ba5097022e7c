"""The compiled CPU kernels for tests that need them: skipped only where the machine has no compiler."""

from types import ModuleType

import pytest

from pagedllm.kernels import build, load_cpu_kernels


def require_compiled_kernels() -> ModuleType:
    """The kernels module; a skip where no C++ compiler exists, a failure where one does but the build failed."""
    if build.compiler() is None:
        pytest.skip("no C++ compiler: the compiled kernels cannot exist here (tests/engine/test_kernel_fallback.py)")
    module = load_cpu_kernels()
    assert module is not None, "a C++ compiler is present but the kernels did not build (see the log)"
    return module
