"""Projection: y = x Wᵀ + b over a loaded weight, prepacked for oneDNN where that is faster.

The weight is reordered once, at load, into the blocked layout oneDNN's matmul reads
(`_reorder_linear_weight`). A weight merely converted to oneDNN's plain layout (`to_mkldnn`) is reordered
again on every call: at 32 rows that measured 133 against 170 GFLOP/s in float32 and 228 against 310 in
bfloat16 (docs/models.md). Packing copies the weight once; the dense weight stays the model's parameter
(state_dict, HF names).
"""

import torch
import torch.nn.functional as F

from pagedllm.model.dtype import has_native_bf16


def can_pack(dtype: torch.dtype) -> bool:
    """float32 always (oneDNN); bfloat16 only where the CPU computes it natively (else it is emulated)."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and has_native_bf16())


# The layout oneDNN picks for a batch of this many rows; every batch of 8 rows or more measured the same
# speed whichever hint from 8 to 1024 packed it (1 picks the plain layout, slower from 8 rows up).
PACK_BATCH_HINT = 64


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] reordered into oneDNN's blocked matmul layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)


class Projection:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> None:
        self.weight, self.bias = weight, bias  # weight: [out, in]
        # oneDNN packs CPU weights only; on a GPU the dense weight is what the matmul wants
        self._packed = packed_weight(weight) if pack and weight.device.type == "cpu" else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] -> [T, out]."""
        if self._packed is None:
            return F.linear(x, self.weight, self.bias)
        # dense in, dense out: only the weight lives in oneDNN's layout
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, self.bias, "none", [], "")
