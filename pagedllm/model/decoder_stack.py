"""The decoder layers in one call into the compiled kernels (pagedllm/csrc/decoder_stack.cpp).

The compiled path's Python loop calls about ten kernels a layer; between two of them it runs a few lines of
glue, which with the caches full of weights and K/V took 4-34 us a transition in decode steps (about 140 us
a layer, 9% of a bfloat16 decode step of the default model; docs/models.md). The stack runs the same ops in
the same order from C++. It covers a batch when every projection runs on one of pagedllm's own matmuls for
that many rows: its float32/bfloat16 matmul for any batch, its AMX matmul up to AMX_OWN_MAX_ROWS (oneDNN runs
larger batches there, and those go through the Python loop, where the glue is small beside the work). A step
with prompt tokens runs all layers but the last here (its last computes the sampled rows alone, in the loop).
"""

import torch

from pagedllm.attention import AttentionMetadata
from pagedllm.kernels import load_cpu_kernels
from pagedllm.model.projection import AMX_OWN_MAX_ROWS


class DecoderStack:
    def __init__(self, stack: object, max_tokens: int | None) -> None:
        self._stack, self.max_tokens = stack, max_tokens  # max_tokens None: any batch

    def covers(self, num_tokens: int) -> bool:
        return self.max_tokens is None or num_tokens <= self.max_tokens

    def __call__(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """Every layer over [T, hidden], or the first num_layers of them: residual updated in place, the last one's
        MLP output returned. kv_caches: one per layer of the model either way."""
        layers = -1 if num_layers is None else num_layers  # -1: all
        return self._stack.forward(hidden, residual, *cos_sin, kv_caches, meta.slot_mapping, meta.block_tables,
                                   meta.seq_lens, meta.query_start_loc, layers)  # fmt: skip


def build_decoder_stack(layers, num_heads: int, num_kv_heads: int, head_dim: int) -> DecoderStack | None:
    """A stack of `layers` (DecoderLayers with fused projections), or None for a model off the CPU, where the
    kernels did not load, or where a projection runs on no matmul of pagedllm's own."""
    first = layers[0].self_attn.qkv if layers else None
    if first is None or first.weight.device.type != "cpu":  # the kernels are the CPU's (not built elsewhere)
        return None
    kernels = load_cpu_kernels()
    if kernels is None:
        return None
    eps = {norm.eps for layer in layers for norm in _norms(layer)}
    if len(eps) != 1:
        return None
    stack = kernels.DecoderStack(num_heads, num_kv_heads, head_dim, eps.pop(), head_dim**-0.5)
    amx = False
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        if attention.qkv is None or mlp.gate_up is None:
            return None
        matmuls = [p.stack_matmul() for p in (attention.qkv, attention.out, mlp.gate_up, mlp.down)]
        if any(m is None for m in matmuls):
            return None
        amx = amx or any(m.amx for m in matmuls)
        norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        stack.add_layer(*norms, *matmuls, _weight(attention.q_norm), _weight(attention.k_norm))
    return DecoderStack(stack, AMX_OWN_MAX_ROWS if amx else None)


def _norms(layer) -> list:
    """The layer's RMSNorms: around attention and the MLP, and Qwen3's over each q and k head."""
    attention = layer.self_attn
    heads = [] if attention.q_norm is None else [attention.q_norm, attention.k_norm]
    return [layer.input_layernorm, layer.post_attention_layernorm, *heads]


def _weight(norm) -> torch.Tensor | None:
    """A norm's weight; None for a norm the layer does not have (Qwen3's q and k norms elsewhere)."""
    return None if norm is None else norm.weight
