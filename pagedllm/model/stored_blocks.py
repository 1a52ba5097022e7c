"""The quantized blocks a weight was stored in (GGUF's Q4_1 and Q8_0), kept beside its dequantized tensor.

A block covers 32 inputs of one output row: Q4_1 stores w = scale * code + low (scale and low float16, codes in
0..15), Q8_0 w = scale * code (codes in -128..127). Where the AMX matmul runs a bfloat16 weight, it can stream
these blocks in decode steps instead of the bfloat16 panels (320 or 544 bytes a tile instead of 1 KB) and expand
them to the same bfloat16 values in L1 (pagedllm/csrc/amx_blocks.h; AmxWeight checks the match at load).
"""

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch

BLOCK_INPUTS = 32
_BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # float16 scale (and low), then the codes


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    scale: torch.Tensor  # float16 [out, in / 32]
    low: torch.Tensor | None  # float16 [out, in / 32] (Q4_1), None (Q8_0)
    codes: torch.Tensor  # [out, in]: uint8 in 0..15 (Q4_1), int8 (Q8_0)

    @staticmethod
    def from_gguf(raw: np.ndarray, kind: str, rows: int, inputs: int) -> "StoredBlocks":
        """raw: a GGUF tensor's bytes for [rows, inputs], blocks in row-major order; kind: "q4_1" or "q8_0"."""
        blocks = np.asarray(raw, np.uint8).reshape(rows, inputs // BLOCK_INPUTS, _BLOCK_BYTES[kind])
        scale = _halves(blocks[..., 0:2])
        if kind == "q8_0":
            return StoredBlocks(scale, None, torch.from_numpy(blocks[..., 2:].reshape(rows, inputs).view(np.int8)))
        packed = blocks[..., 4:]  # byte i: code i (low nibble), code 16 + i (high nibble)
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, inputs)
        return StoredBlocks(scale, _halves(blocks[..., 2:4]), torch.from_numpy(codes))

    def dequantized(self) -> torch.Tensor:
        """float32 [out, in], computed as GGUF's dequantization computes it."""
        scale = self.scale.float().repeat_interleave(BLOCK_INPUTS, dim=1)
        if self.low is None:
            return self.codes.float() * scale
        return scale * self.codes.float() + self.low.float().repeat_interleave(BLOCK_INPUTS, dim=1)

    def take_rows(self, order: np.ndarray) -> "StoredBlocks":
        """The blocks of rows `order` (a permutation or selection of output rows)."""
        index = torch.from_numpy(np.asarray(order, np.int64))
        low = None if self.low is None else self.low[index].contiguous()
        return StoredBlocks(self.scale[index].contiguous(), low, self.codes[index].contiguous())


def stack_blocks(parts: list[StoredBlocks | None]) -> StoredBlocks | None:
    """The blocks of weights whose rows are stacked (as fuse_linears stacks them), or None unless all have blocks
    of one kind."""
    if not parts or any(p is None for p in parts) or len({p.low is None for p in parts}) > 1:
        return None
    low = None if parts[0].low is None else torch.cat([p.low for p in parts])
    return StoredBlocks(torch.cat([p.scale for p in parts]), low, torch.cat([p.codes for p in parts]))


def _halves(pairs: np.ndarray) -> torch.Tensor:
    """[..., 2] bytes -> float16 [...]."""
    return torch.from_numpy(np.ascontiguousarray(pairs).view(np.float16)[..., 0].copy())


EMPTY_BLOCKS: "MappingProxyType[str, StoredBlocks]" = MappingProxyType({})  # the default of a model loaded otherwise
