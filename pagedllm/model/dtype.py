"""The engine's dtype: "auto" is bfloat16 only where the CPU computes in bfloat16 natively.

Without AVX512-BF16 or AMX every bfloat16 matmul is emulated and runs several times slower than float32,
so "auto" picks float32 there. The choice reads the CPU's flags, never an assumption about the machine.
On a CUDA device "auto" is bfloat16 when the GPU computes it natively (Ampere and later), else float32.
"""

import torch

from pagedllm.kernels import cpu_flags

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def has_native_bf16(flags: list[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def resolve_dtype(name: str, flags: list[str] | None = None, device: torch.device | None = None) -> torch.dtype:
    """"auto", "float32" or "bfloat16" -> the torch dtype the engine runs in on `device` (default the CPU)."""
    if name != "auto":
        return DTYPES[name]
    if device is not None and device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if has_native_bf16(flags) else torch.float32


def describe_dtype(name: str, dtype: torch.dtype, device: torch.device | None = None) -> str:
    """For the startup log: the dtype, and why when "auto" chose it."""
    short = str(dtype).removeprefix("torch.")
    if name != "auto":
        return short
    gpu = device is not None and device.type == "cuda"
    if dtype == torch.bfloat16:
        reason = "the GPU has native bfloat16" if gpu else "the CPU has native bfloat16"
    else:
        reason = "no native bfloat16 on this GPU" if gpu else "no native bfloat16 on this CPU"
    return f"{short} (auto: {reason})"
