"""Import the kernel modules on first use, in the mode triton is in at that moment.

@triton.jit decides compiled or interpreted (TRITON_INTERPRET=1) when a kernel is defined, that is when
its module is imported. If the mode has changed since, the modules are executed again so the kernels
match it: the interpreter tests then work in any process, whatever imported the kernels before.
"""

import importlib
import os
import sys
from types import ModuleType

_ORDER = ("tile", "decode", "split_merge", "prefill", "kv_write", "block_copy")  # helpers before their users
_modules: dict[str, ModuleType] = {}
_mode: list[bool] = []  # the mode the modules were last imported in; empty before the first import


def interpreting() -> bool:
    try:
        from triton import knobs  # triton >= 3.4
    except ImportError:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return bool(knobs.runtime.interpret)


def kernels() -> dict[str, ModuleType]:
    """The kernel modules by short name, defined in the current mode."""
    mode = interpreting()
    if _mode != [mode]:
        for name in _ORDER:
            full = f"{__package__}.{name}"
            loaded = sys.modules.get(full)
            _modules[name] = importlib.reload(loaded) if loaded else importlib.import_module(full)
        _mode[:] = [mode]
    return _modules


def check_device(tensor: "object") -> None:
    """Compiled kernels need CUDA tensors; the interpreter needs CPU tensors."""
    on_cuda = getattr(tensor, "is_cuda", False)
    if interpreting() and on_cuda:
        raise ValueError("TRITON_INTERPRET=1 runs the kernels on CPU tensors; got a CUDA tensor")
    if not interpreting() and not on_cuda:
        raise ValueError("the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")
