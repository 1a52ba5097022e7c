"""A Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) over the paged KV cache.

Parameter names equal Hugging Face's, so an HF state dict loads as is. The model sees the batch as one
flat run of tokens ([T]) plus an AttentionMetadata; it never sees a block table directly.
"""

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from pagedllm.attention import AttentionMetadata, paged_attention, write_kv
from pagedllm.model import compiled_ops as ops
from pagedllm.model.config import ModelConfig
from pagedllm.model.decoder_stack import DecoderStack, build_decoder_stack
from pagedllm.model.layers import RMSNorm, RotaryEmbedding, SwiGLUMLP, apply_rotary, fuse_linears
from pagedllm.model.parallel import ParallelLayout, no_reduce
from pagedllm.model.projection import Projection, can_pack
from pagedllm.model.stored_blocks import EMPTY_BLOCKS, StoredBlocks, stack_blocks


class OutputRows(NamedTuple):
    """The rows whose outputs are wanted after the last layer, and the attention metadata of them alone."""

    index: torch.Tensor  # [S'] int64 rows of the step's tokens
    meta: AttentionMetadata


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.scale = self.head_dim**-0.5
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        # Qwen3: an RMSNorm over each head of q and of k, before the rotary
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.qkv: Projection | None = None  # fused q/k/v and packed o, once fuse() ran
        self.out: Projection | None = None

    def fuse(self, pack: bool = False, blocks: Mapping[str, StoredBlocks] = EMPTY_BLOCKS) -> None:
        """One matmul for q, k and v (measured ~10% faster per step); q/k/v_proj keep HF names as views.
        blocks: the stored blocks of q_proj, k_proj, v_proj and o_proj loaded from them (by those names)."""
        qkv = stack_blocks([blocks.get("q_proj"), blocks.get("k_proj"), blocks.get("v_proj")])
        self.qkv = Projection(*fuse_linears([self.q_proj, self.k_proj, self.v_proj]), pack, qkv)
        self.out = Projection(self.o_proj.weight, None, pack, blocks.get("o_proj"))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.qkv(x).split([q_size, kv_size, kv_size], dim=-1)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos_sin: tuple[torch.Tensor, torch.Tensor],  # each [T, 1, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kv_heads, head_dim]
        meta: AttentionMetadata,
        attention_impl: str,
        rows: OutputRows | None = None,
    ) -> torch.Tensor:
        """[T, hidden] -> [T, hidden], or with `rows` the outputs of those rows only (every row's K/V written)."""
        num_tokens = x.shape[0]
        q, k, v = self.project_qkv(x)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        write_kv(k, v, kv_cache, meta.slot_mapping, attention_impl)
        if rows is not None:
            q, meta = q[rows.index], rows.meta
        out = paged_attention(q, kv_cache, meta, self.scale, impl=attention_impl)  # [T, H, D]
        out = out.reshape(q.shape[0], self.num_heads * self.head_dim)
        return self.o_proj(out) if self.out is None else self.out(out)

    def forward_compiled(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        rows: OutputRows | None = None,
    ) -> torch.Tensor:
        """The compiled path: rotary in place on q/k views of the qkv output, then the paged kernels."""
        num_tokens = x.shape[0]
        q, k, v = self.project_qkv(x)  # views into one [T, (H + 2 KVH) D] tensor once fused
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, D], rows strided
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            ops.head_rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            ops.head_rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        ops.rotary(q, *cos_sin)
        ops.rotary(k, *cos_sin)
        if rows is None:
            out = ops.attention(q, k, v, kv_cache, meta, self.scale)  # [T, H, D] contiguous
        else:
            out = ops.attention(q, k, v, kv_cache, meta, self.scale, rows.index, rows.meta)
        out = out.view(out.shape[0], self.num_heads * self.head_dim)
        return self.o_proj(out) if self.out is None else self.out(out)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size)
        self.all_reduce = no_reduce  # tensor parallelism: the sum of the ranks' row-parallel outputs

    def forward(self, x, cos_sin, kv_cache, meta, attention_impl: str, rows: OutputRows | None = None):
        """[T, hidden] -> [T, hidden], or with `rows` those rows only (every row's K/V still written)."""
        attended = self.self_attn(self.input_layernorm(x), cos_sin, kv_cache, meta, attention_impl, rows)
        x = (x if rows is None else x[rows.index]) + self.all_reduce(attended)
        return x + self.all_reduce(self.mlp(self.post_attention_layernorm(x)))

    def forward_compiled(
        self, hidden: torch.Tensor, residual: torch.Tensor, cos_sin, kv_cache, meta, rows: OutputRows | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous sublayer's output; residual: the stream so far. Both [T, hidden], updated in
        place (residual += hidden, then hidden = norm(residual)); returns this layer's MLP output and the
        residual stream, with `rows` of those rows only."""
        self.input_layernorm.forward_compiled(hidden, residual)
        hidden = self.all_reduce(self.self_attn.forward_compiled(hidden, cos_sin, kv_cache, meta, rows))
        if rows is not None:
            residual = residual[rows.index]
        self.post_attention_layernorm.forward_compiled(hidden, residual)
        return self.all_reduce(self.mlp.forward_compiled(hidden)), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # _weight: no random init (the weights are loaded; initialising on the meta device imports torch._dynamo,
        # over a second of every start)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config)
        self.head: Projection | None = None  # lm_head, packed, once fuse_projections() ran
        self.stack: DecoderStack | None = None  # the layers in one compiled call, once fuse_projections() ran
        self.parallel: ParallelLayout | None = None  # set on a tensor-parallel rank: its model is a shard
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64, any order per sequence
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        attention_impl: str = "auto",
        output_rows: torch.Tensor | None = None,  # [S'] int64
        output_meta: AttentionMetadata | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [T, hidden], or of output_rows only [S', hidden]; writes each layer's new
        K/V into kv_caches. With output_meta (meta cut to those rows, AttentionMetadata.last_tokens) the last
        layer works on those rows alone after writing every row's K/V: the other rows' attention output and
        MLP feed nothing."""
        x = self.embed(input_ids)  # [T, hidden]
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        rows = None if output_rows is None or output_meta is None else OutputRows(output_rows, output_meta)
        if attention_impl == "compiled":
            x = self._forward_compiled(x, cos_sin, kv_caches, meta, rows)
        else:
            for layer, kv_cache, layer_rows in zip(self.model.layers, kv_caches, self._layer_rows(rows), strict=True):
                x = layer(x, cos_sin, kv_cache, meta, attention_impl, layer_rows)
            x = self.model.norm(x)
        if rows is None and output_rows is not None:  # the whole last layer ran
            x = x[output_rows]
        return x

    def _layer_rows(self, rows: OutputRows | None) -> list[OutputRows | None]:
        """Per layer, the rows it works on alone: `rows` for the last layer, every row for the others."""
        return [None] * (len(self.model.layers) - 1) + [rows]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden]. A tensor-parallel rank looks up the ids in its vocabulary slice, zeroes the
        others' rows, and the sum over ranks gives every row."""
        if self.parallel is None:
            return self.model.embed_tokens(input_ids)
        local = input_ids - self.parallel.vocab_start
        outside = (local < 0) | (input_ids >= self.parallel.vocab_stop)
        x = self.model.embed_tokens(local.masked_fill(outside, 0))
        return self.parallel.all_reduce(x.masked_fill_(outside.unsqueeze(1), 0))

    def set_parallel(self, layout: ParallelLayout) -> None:
        self.parallel = layout
        for layer in self.model.layers:
            layer.all_reduce = layout.all_reduce

    def _forward_compiled(self, x, cos_sin, kv_caches, meta, rows: OutputRows | None) -> torch.Tensor:
        """Same maths with the compiled kernels: the residual stream is kept apart from each sublayer's
        output so that every residual add is fused into the RMSNorm that follows it."""
        residual, hidden = x, torch.zeros_like(x)  # residual += 0 leaves the embeddings as they are
        layers = list(zip(self.model.layers, kv_caches, self._layer_rows(rows), strict=True))
        if self.parallel is None and self.stack is not None and self.stack.covers(x.shape[0]):
            # the same layers in one call; with `rows`, all but the last, which then runs on those rows alone
            num_layers = None if rows is None else len(layers) - 1
            hidden = self.stack(hidden, residual, cos_sin, kv_caches, meta, num_layers=num_layers)
            layers = [] if rows is None else layers[-1:]
        for layer, kv_cache, layer_rows in layers:
            hidden, residual = layer.forward_compiled(hidden, residual, cos_sin, kv_cache, meta, layer_rows)
        self.model.norm.forward_compiled(hidden, residual)
        return hidden

    def fuse_projections(self, blocks: Mapping[str, StoredBlocks] = EMPTY_BLOCKS) -> "LlamaForCausalLM":
        """Call after the weights are in place (load_model does); packs float32 weights for oneDNN. blocks: the
        stored blocks of the weights loaded from them, by state-dict name (read_gguf_with_blocks)."""
        pack = can_pack(self.lm_head.weight.dtype)
        for i, layer in enumerate(self.model.layers):
            layer.self_attn.fuse(pack, _blocks_under(blocks, f"model.layers.{i}.self_attn."))
            layer.mlp.fuse(pack, _blocks_under(blocks, f"model.layers.{i}.mlp."))
        head = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        self.head = Projection(self.lm_head.weight, None, pack, blocks.get(head))
        config = self.config
        self.stack = build_decoder_stack(self.model.layers, config.num_heads, config.num_kv_heads, config.head_dim)
        return self

    def count_streamed_blocks(self) -> tuple[int, int]:
        """(weights whose small batches stream their stored blocks, packed weights): for the startup log."""
        packed = [self.head] + [p for layer in self.model.layers
                                for p in (layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up, layer.mlp.down)]
        packed = [p for p in packed if p is not None]
        return sum(p.streams_blocks for p in packed), len(packed)

    def greedy_picks(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """hidden: [T, hidden] -> each row's greedy token and its raw logprob, from the LM head's own pass without the
        [T, vocab] logits (Projection.greedy_picks), or None where the head cannot (then compute_logits)."""
        return self.head.greedy_picks(hidden) if self.head is not None else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [T, hidden] -> float32 logits [T, vocab] (a tensor-parallel rank: its vocabulary slice's)."""
        if self.head is not None:
            return self.head.float_outputs(hidden)
        return self.lm_head(hidden).float()


def _blocks_under(blocks: Mapping[str, StoredBlocks], prefix: str) -> dict[str, StoredBlocks]:
    """The blocks of the weights under a module prefix, by their linear's name ("q_proj")."""
    return {name[len(prefix) :].removesuffix(".weight"): b for name, b in blocks.items() if name.startswith(prefix)}
