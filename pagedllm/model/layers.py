"""Building blocks of a Llama-family decoder: RMSNorm, rotary embeddings, SwiGLU MLP."""

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.model import compiled_ops
from pagedllm.model.config import ModelConfig
from pagedllm.model.projection import GatedProjection, Projection
from pagedllm.model.rope import rope_attention_factor, rope_inv_freq
from pagedllm.model.stored_blocks import EMPTY_BLOCKS, StoredBlocks, stack_blocks


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward_compiled(self, hidden: torch.Tensor, residual: torch.Tensor) -> None:
        """In place: residual += hidden, then hidden = self(residual)."""
        compiled_ops.add_rms_norm(hidden, residual, self.weight, self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden]; normalise in float32 like the reference, scale in the weight dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding:
    """cos/sin for arbitrary per-token positions (not an nn.Module: nothing to load)."""

    def __init__(self, config: ModelConfig) -> None:
        self.inv_freq = rope_inv_freq(config.rope_theta, config.head_dim, config.rope_scaling)  # [head_dim / 2]
        self.attention_factor = rope_attention_factor(config.rope_scaling)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] int64 -> cos, sin: [T, 1, head_dim] in `dtype` (broadcast over heads)."""
        freqs = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)  # [T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # [T, 1, d]
        if self.attention_factor != 1.0:
            return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim], HF's half-split layout (first half pairs with second half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class SwiGLUMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up: GatedProjection | None = None  # gate/up with the activation, and down, once fuse() ran
        self.down: Projection | None = None

    def fuse(self, pack: bool = False, blocks: Mapping[str, StoredBlocks] = EMPTY_BLOCKS) -> None:
        """blocks: the stored blocks of gate_proj, up_proj and down_proj loaded from them (by those names)."""
        gate_up = stack_blocks([blocks.get("gate_proj"), blocks.get("up_proj")])
        self.gate_up = GatedProjection(*fuse_linears([self.gate_proj, self.up_proj]), pack, gate_up)
        self.down = Projection(self.down_proj.weight, None, pack, blocks.get("down_proj"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden] -> [T, intermediate] -> [T, hidden]
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down(self.gate_up(x, silu_mul))

    def forward_compiled(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            act = compiled_ops.silu_mul(torch.cat([self.gate_proj(x), self.up_proj(x)], -1))
            return self.down_proj(act)
        return self.down(self.gate_up(x, compiled_ops.silu_mul))  # [T, intermediate] in between


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 I] -> silu(gate) * up: [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the output rows of several Linears into one weight (and bias), then make each Linear's
    parameters views into it: one matmul at run time, HF parameter names and no extra memory kept."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias
