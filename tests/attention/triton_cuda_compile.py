"""Compile every Triton kernel for a CUDA target, without a GPU: run as a script in a process without
TRITON_INTERPRET. Each launcher is called with CPU tensors of a real batch while its kernel is replaced by a
recorder, and the recorded arguments become the compile signature, so what is compiled is what the
launchers pass. Triton's front end, its GPU passes and ptxas all run; nothing is launched.
Prints one line per compiled kernel; exits non-zero on the first failure.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from attn_helpers import make_batch  # noqa: E402

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64", torch.int32: "i32"}


class Recorder:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **constexprs) records the call."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid: tuple):
        return lambda *args, **constexprs: self.calls.append((args, constexprs))


def signature(fn, args: tuple, constexprs: dict) -> dict[str, str]:
    sig = {}
    for name, value in zip(fn.arg_names, args):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + TYPES[value.dtype]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i64" if abs(value) >= 2**31 else "i32"
    return sig | {name: "constexpr" for name in constexprs}


def run_launchers(k: dict, dtype: torch.dtype, heads: tuple[int, int], head_dim: int) -> None:
    b = make_batch([(30, 1), (5, 12)], *heads, 16, head_dim=head_dim, dtype=dtype)
    ids, rows = torch.tensor([0]), torch.tensor([0])
    k["decode"].launch_decode(b.query, b.kv_cache, b.meta.block_tables, b.meta.seq_lens, ids, rows, 0.1, 32, 1, 32)
    m = torch.zeros(1, heads[0], 1)
    o = torch.zeros(1, heads[0], 1, head_dim)
    k["split_merge"].launch_merge(m, m, o, b.meta.seq_lens, ids, rows, 32, b.query)
    # a CUDA graph's fixed decode plan: ceil(8192 / 256) = 32 splits (decode_only_plan, max_model_len 8192)
    m32, o32 = torch.zeros(1, heads[0], 32), torch.zeros(1, heads[0], 32, head_dim)
    k["split_merge"].launch_merge(m32, m32, o32, b.meta.seq_lens, ids, rows, 256, b.query)
    tensors = (b.meta.block_tables, b.meta.seq_lens, b.meta.query_start_loc)
    k["prefill"].launch_prefill(b.query, b.kv_cache, b.query, tensors, ids + 1, ids, 0.1, 16, 32)
    key = torch.zeros(3, heads[1], head_dim)
    k["kv_write"].launch_write_kv(key, key, b.kv_cache, torch.tensor([0, -1, 5]))
    k["block_copy"].launch_copy_blocks(b.kv_cache, b.kv_cache, torch.tensor([[0, 1]]))


def main() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from pagedllm.attention.triton.loader import kernels

    k = kernels()
    names = {"decode": "paged_decode_kernel", "split_merge": "merge_splits_kernel", "prefill": "paged_prefill_kernel",
             "kv_write": "write_kv_kernel", "block_copy": "copy_blocks_kernel"}
    real = {module: getattr(k[module], fn) for module, fn in names.items()}
    recorders = {module: Recorder() for module in names}
    for module, fn in names.items():
        setattr(k[module], fn, recorders[module])
    for dtype in (torch.float32, torch.bfloat16):
        for heads, head_dim in (((9, 3), 64), ((8, 2), 128)):
            run_launchers(k, dtype, heads, head_dim)
    target = GPUTarget("cuda", 90, 32)
    for module, recorder in recorders.items():
        for args, constexprs in recorder.calls:
            fn = real[module]
            compile(ASTSource(fn, signature(fn, args, constexprs), constexprs), target=target)
            print(fn.__name__, {n: v for n, v in constexprs.items() if n != "UPCAST"}, "compiled")


if __name__ == "__main__":
    main()
