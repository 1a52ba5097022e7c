"""The 4-bit blocks a weight was stored in (GGUF's Q4_1), kept beside its dequantized tensor.

A Q4_1 block covers 32 inputs of one output row: w = scale * code + low, with scale and low float16 and codes in
0..15. Where the AMX matmul runs a bfloat16 weight, it can stream these blocks in decode steps instead of the
bfloat16 panels (320 bytes a tile instead of 1 KB) and expand them to the same bfloat16 values in L1
(pagedllm/csrc/amx_q4.h; AmxWeight checks the match at load).
"""

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch

Q4_1_BLOCK = 32  # inputs per block
_Q4_1_BLOCK_BYTES = 20  # float16 scale, float16 low, 16 bytes of two codes each


@dataclass(frozen=True, slots=True)
class Q4Blocks:
    scale: torch.Tensor  # float16 [out, in / 32]
    low: torch.Tensor  # float16 [out, in / 32]
    codes: torch.Tensor  # uint8 [out, in], each in 0..15

    @staticmethod
    def from_q4_1(raw: np.ndarray, rows: int, inputs: int) -> "Q4Blocks":
        """raw: a GGUF Q4_1 tensor's bytes for [rows, inputs] (blocks in row-major order)."""
        blocks = np.asarray(raw, np.uint8).reshape(rows, inputs // Q4_1_BLOCK, _Q4_1_BLOCK_BYTES)
        scale = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0]
        low = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0]
        packed = blocks[..., 4:]  # byte i: code i (low nibble), code 16 + i (high nibble)
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, inputs)
        return Q4Blocks(torch.from_numpy(scale.copy()), torch.from_numpy(low.copy()), torch.from_numpy(codes))

    def dequantized(self) -> torch.Tensor:
        """float32 [out, in]: scale * code + low, in the order GGUF's dequantization computes it."""
        scale = self.scale.float().repeat_interleave(Q4_1_BLOCK, dim=1)
        low = self.low.float().repeat_interleave(Q4_1_BLOCK, dim=1)
        return scale * self.codes.float() + low

    def take_rows(self, order: np.ndarray) -> "Q4Blocks":
        """The blocks of rows `order` (a permutation or selection of output rows)."""
        index = torch.from_numpy(np.asarray(order, np.int64))
        return Q4Blocks(self.scale[index].contiguous(), self.low[index].contiguous(), self.codes[index].contiguous())


def stack_blocks(parts: list["Q4Blocks | None"]) -> Q4Blocks | None:
    """The blocks of weights whose rows are stacked (as fuse_linears stacks them), or None unless all have some."""
    if not parts or any(p is None for p in parts):
        return None
    return Q4Blocks(torch.cat([p.scale for p in parts]), torch.cat([p.low for p in parts]),
                    torch.cat([p.codes for p in parts]))  # fmt: skip


EMPTY_BLOCKS: "MappingProxyType[str, Q4Blocks]" = MappingProxyType({})  # the default of a model loaded otherwise
