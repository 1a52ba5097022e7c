"""Projection: y = x Wᵀ + b over a loaded weight, packed once at load for the matmul that runs it fastest.

- float32 on a CPU with AVX-512 or AVX2, and bfloat16 on one with AVX512-BF16 but no AMX, when the kernels
  loaded: pagedllm's own matmul (pagedllm/csrc/linear.cpp) over the weight packed into panels of 48 columns
  (AVX-512) or 16 (AVX2). It prefetches the weights it reads next, so it beats oneDNN where a decode step
  streams every weight from memory for a few rows (1.2-1.9x at 1-64 rows) and matches it on prefill-sized
  batches (docs/models.md). bfloat16 multiplies with vdpbf16ps or with the weights widened to float32 FMAs,
  whichever a first timing on this CPU finds faster (`describe_matmul` says which).
- bfloat16 on a CPU with AMX: pagedllm's AMX matmul (pagedllm/csrc/amx_linear.cpp) over the weight packed
  into tiles, for batches of up to AMX_OWN_MAX_ROWS rows (decode steps and prompt chunks), and oneDNN's
  matmul (on AMX too) over a second packing for larger ones: 1.4-2.9x the AVX512-BF16 matmul at 8-64 rows,
  about 5x on prefill-sized batches (docs/models.md). An MLP's gate/up is packed gated there too (silu(gate) * up
  as the AMX matmul stores), and runs on the AMX matmul at every batch size. A weight loaded from Q4_1 or
  Q8_0 blocks (a GGUF file) is packed from those blocks as well, and small batches stream them, 320 or 544
  bytes a tile against the bfloat16 tile's 1 KB, expanded to the same bfloat16 values in L1
  (pagedllm/csrc/amx_blocks.h).
- Otherwise oneDNN, the weight reordered into the blocked layout its matmul reads (`_reorder_linear_weight`).
  A weight merely converted to oneDNN's plain layout (`to_mkldnn`) is reordered again on every call: at 32
  rows that measured 133 against 170 GFLOP/s in float32 and 228 against 310 in bfloat16.

Packing copies the weight once; the dense weight stays the model's parameter (state_dict, HF names).

GatedProjection is an MLP's fused [gate; up] projection with its activation, silu(gate) * up: on pagedllm's
matmuls the two halves are packed side by side (in every panel; on AMX, a gate panel next to its up panel) and
the activation is applied as the outputs are stored, so the [T, 2 I] product is never written to memory and
read back.
"""

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

from pagedllm.kernels import load_cpu_kernels
from pagedllm.model.dtype import has_native_bf16
from pagedllm.model.stored_blocks import StoredBlocks

# Rows up to which pagedllm's AMX matmul runs a bfloat16 batch; oneDNN's (on AMX too) runs larger ones. On a
# 2-core Xeon oneDNN ran some of the default model's matmuls at its one-thread rate below about 1400 rows (the
# MLP's down projection at 256-1280), so a layer's four took 1.2-1.5x as long as on the AMX matmul there; at
# 2048 rows oneDNN's were 3-7% faster in whole runs (docs/models.md).
AMX_OWN_MAX_ROWS = 1280


Activation = Callable[[torch.Tensor], torch.Tensor]  # [T, 2 I] -> [T, I]: silu(gate) * up


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


def linear_kernels(dtype: torch.dtype) -> ModuleType | None:
    """The compiled kernels if they hold pagedllm's own matmul for this dtype on this CPU: float32 with
    AVX-512 or AVX2, bfloat16 with AVX512-BF16."""
    if dtype not in (torch.float32, torch.bfloat16):
        return None
    module = load_cpu_kernels()
    return module if module is not None and module.has_linear_kernel(dtype == torch.bfloat16) else None


def own_matmul(weight: torch.Tensor, pack: bool) -> ModuleType | None:
    """The compiled kernels if pagedllm's matmul can run this weight: packing asked for, on the CPU, a dtype
    and CPU it covers, and (bfloat16) an even number of inputs, since it reads them in pairs."""
    if not pack or weight.device.type != "cpu":
        return None
    kernels = linear_kernels(weight.dtype)
    return kernels if kernels is not None and (weight.dtype == torch.float32 or weight.shape[1] % 2 == 0) else None


BF16_PATH_DESCRIPTIONS = {
    "dot": "vdpbf16ps pair dot products (timed faster here than bfloat16 widened to float32 FMAs)",
    "widen": "bfloat16 weights widened to float32 FMAs (timed faster here than vdpbf16ps)",
}


def describe_matmul(dtype: torch.dtype, device: torch.device) -> str:
    """For the startup log: which matmul runs the projections, and for bfloat16 on pagedllm's which way it
    multiplies (measured once on this CPU: some cores issue vdpbf16ps at half their FMA rate)."""
    if device.type != "cpu":
        return "torch"
    if not can_pack(dtype):
        return "torch (unpacked)"
    kernels = linear_kernels(dtype)
    if kernels is None:
        return "oneDNN (prepacked)"
    if dtype != torch.bfloat16:
        return "pagedllm's"
    if amx_matmul_kernels() is not None:
        return (f"pagedllm's on AMX tiles up to {AMX_OWN_MAX_ROWS} rows (the MLP's gate/up at every size), "
                "oneDNN's (AMX) above")
    return f"pagedllm's, {BF16_PATH_DESCRIPTIONS[kernels.bf16_matmul_path()]}"


class Projection:
    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool, blocks: StoredBlocks | None = None
    ) -> None:
        """blocks: the stored blocks the weight was loaded from, if it was (see AmxWeight)."""
        self.weight, self.bias = weight, bias  # weight: [out, in]
        amx = amx_kernels(weight, pack)
        self._amx = AmxWeight(weight, bias, amx, blocks=blocks) if amx is not None else None
        self._kernels = own_matmul(weight, pack) if amx is None else None
        self._packed: torch.Tensor | None = None
        if self._amx is not None:
            return
        if self._kernels is not None:
            self._packed = self._kernels.pack_linear(weight.detach().contiguous())
        elif pack and weight.device.type == "cpu":  # on a GPU the dense weight is what the matmul wants
            self._packed = packed_weight(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] -> [T, out]."""
        if self._amx is not None:
            return self._amx(x)
        if self._packed is None:
            return F.linear(x, self.weight, self.bias)
        if self._kernels is not None:
            return self._kernels.linear(x.contiguous(), self._packed, self.bias, self.weight.shape[0])
        return onednn_linear(x, self._packed, self.bias)

    @property
    def streams_blocks(self) -> bool:
        """Whether small batches stream the stored blocks the weight was loaded from (AmxWeight)."""
        return self._amx is not None and self._amx.streams_blocks

    def float_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """self(x).float(): on the AMX matmul in the same pass as the matmul (the LM head's logits)."""
        return self._amx.float_outputs(x) if self._amx is not None else self(x).float()

    def greedy_picks(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per row of self(x) (an LM head's logits): its first argmax and that logit's log-probability. On AMX tiles
        the matmul computes them as it makes the logits, which are never written out; on pagedllm's other matmul one
        compiled pass over the logits does (the sampler's own summary, without its Python around it). None where
        neither runs this weight, or the batch is too large for the AMX pass. A log-probability is NaN where a row's
        logits are not all finite."""
        if self._amx is not None:
            return self._amx.greedy_picks(x)
        if self._kernels is None:
            return None
        logits = self.float_outputs(x)
        tokens, log_z = self._kernels.greedy_summary(logits)
        return tokens, logits.gather(1, tokens[:, None]).squeeze(1) - log_z

    def stack_matmul(self) -> object | None:
        """This projection as a kernels.StackMatmul (decoder_stack.py), or None where it runs on oneDNN or torch."""
        if self._amx is not None:
            return self._amx.stack_matmul()
        if self._kernels is None:
            return None
        return self._kernels.StackMatmul(self._packed, self.bias, self.weight.shape[0], amx=False)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Dense in, dense out: only the weight lives in oneDNN's layout."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class AmxWeight:
    """A bfloat16 weight on a CPU with AMX, packed into AMX tiles for pagedllm's matmul (batches of up to
    AMX_OWN_MAX_ROWS rows) and into oneDNN's layout for larger batches. Gated (an MLP's [gate; up] weight): the
    AMX matmul runs every batch, applying silu(gate) * up as it stores, and there is no oneDNN copy: oneDNN's
    faster tiles at prompt-sized batches did not make up for writing [T, 2 I] and reading it back for the
    activation (2048-row prompt steps 7% slower: docs/models.md)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        kernels: ModuleType,
        gated: bool = False,
        blocks: StoredBlocks | None = None,
    ) -> None:
        """blocks: the stored blocks the weight was loaded from: packed tile by tile too, and kept where every tile
        expands to the bfloat16 weight's (the matmul then streams them for small batches: the same results)."""
        self.out_features = weight.shape[0] // 2 if gated else weight.shape[0]
        self.bias, self.gated, self._kernels = bias, gated, kernels
        self._tiles = kernels.pack_amx_linear(weight.detach().contiguous(), gated=gated)
        self._onednn = None if gated else packed_weight(weight)
        self._blocks = self._pack_blocks(blocks) if blocks is not None else None

    def _pack_blocks(self, blocks: StoredBlocks) -> torch.Tensor | None:
        tiles = self._kernels.pack_amx_blocks(blocks.scale, blocks.low, blocks.codes, gated=self.gated)
        return tiles if self._kernels.amx_blocks_match(tiles, self._tiles) else None

    @property
    def streams_blocks(self) -> bool:
        """Whether small batches stream the weight's stored blocks."""
        return self._blocks is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]; gated: silu(gate) * up, [T, I]."""
        if self._onednn is not None and x.shape[0] > AMX_OWN_MAX_ROWS:
            return onednn_linear(x, self._onednn, self.bias)
        return self._kernels.amx_linear(x.contiguous(), self._tiles, self.bias, self.out_features, gated=self.gated,
                                        blocks=self._blocks)  # fmt: skip

    def float_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """self(x).float() of an ungated weight; up to AMX_OWN_MAX_ROWS rows the matmul stores the float32 values of
        its bfloat16 results itself (a decode step's [32, 49152] logits: no second pass over them)."""
        if self.gated or x.shape[0] > AMX_OWN_MAX_ROWS:
            return self(x).float()
        return self._kernels.amx_linear(x.contiguous(), self._tiles, self.bias, self.out_features, float_output=True,
                                        blocks=self._blocks)  # fmt: skip

    def greedy_picks(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """See Projection.greedy_picks."""
        if self.gated or x.shape[0] > AMX_OWN_MAX_ROWS:
            return None
        return self._kernels.amx_greedy_head(x.contiguous(), self._tiles, self.bias, self.out_features,
                                             blocks=self._blocks)  # fmt: skip

    def stack_matmul(self) -> object:
        """Its AMX matmul as a kernels.StackMatmul: a stack runs it only for batches of up to AMX_OWN_MAX_ROWS (where
        every projection of a layer runs on it)."""
        return self._kernels.StackMatmul(self._tiles, self.bias, self.out_features, amx=True, gated=self.gated,
                                         blocks=self._blocks)  # fmt: skip


def amx_matmul_kernels() -> ModuleType | None:
    """The compiled kernels if they hold the AMX matmul and the OS lets it use the tiles (the kernels are built
    for this CPU, so the CPU has AMX-BF16)."""
    kernels = load_cpu_kernels()
    return kernels if kernels is not None and kernels.has_amx_tiles() else None


def amx_kernels(weight: torch.Tensor, pack: bool) -> ModuleType | None:
    """The compiled kernels if their AMX matmul can run this weight: packing asked for, a bfloat16 weight on
    the CPU, and inputs that fill whole tile steps (32)."""
    if not pack or weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or weight.shape[1] % 32 != 0:
        return None
    return amx_matmul_kernels()


class GatedProjection:
    """x [T, in] -> activation(x [gate; up]ᵀ + bias) [T, I], for a fused weight [2 I, in] (gate rows, then up
    rows). Where one of pagedllm's matmuls runs the weight, the activation is silu(gate) * up, computed as the
    matmul stores its outputs; elsewhere the caller's activation is applied to the output of a Projection."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool, blocks: StoredBlocks | None = None
    ) -> None:
        """blocks: the stored blocks of [gate; up], if it was loaded from them (see AmxWeight)."""
        self.intermediate = weight.shape[0] // 2
        self.bias = bias
        amx = amx_kernels(weight, pack)
        self._amx = AmxWeight(weight, bias, amx, gated=True, blocks=blocks) if amx is not None else None
        self._kernels = own_matmul(weight, pack) if amx is None else None
        if self._kernels is not None:
            self._packed = self._kernels.pack_linear(weight.detach().contiguous(), gated=True)
        elif self._amx is None:
            self._projection = Projection(weight, bias, pack)

    def stack_matmul(self) -> object | None:
        """As Projection.stack_matmul, gated (silu(gate) * up in the matmul) where one of pagedllm's matmuls runs
        the weight, else the [gate; up] projection, which the stack follows with silu_mul."""
        if self._amx is not None:
            return self._amx.stack_matmul()
        if self._kernels is not None:
            return self._kernels.StackMatmul(self._packed, self.bias, self.intermediate, amx=False, gated=True)
        return self._projection.stack_matmul()

    @property
    def streams_blocks(self) -> bool:
        """Whether small batches stream the stored blocks the weight was loaded from (AmxWeight)."""
        return self._amx is not None and self._amx.streams_blocks

    @property
    def fused(self) -> bool:
        """Whether a matmul of pagedllm's applies the activation."""
        return self._kernels is not None or self._amx is not None

    def __call__(self, x: torch.Tensor, activation: Activation) -> torch.Tensor:
        """activation: [T, 2 I] -> [T, I], silu(gate) * up; used only where the matmul does not fuse it."""
        if self._amx is not None:
            return self._amx(x)
        if self._kernels is not None:
            return self._kernels.linear(x.contiguous(), self._packed, self.bias, self.intermediate, gated=True)
        return activation(self._projection(x))
