"""Megatron-style tensor-parallel sharding of a Llama-family model: which slice of each weight a rank holds.

- Attention: query heads split evenly; q/k/v column-parallel (output rows), o row-parallel (input columns).
  KV heads split evenly, or replicated when there are more ranks than KV heads (each rank then holds the
  one KV head its query heads read).
- MLP: gate/up column-parallel, down row-parallel.
- Embedding and lm_head: vocab-parallel, ceil(vocab / ranks) rows per rank, the last rank's padded with zeros.
- Norms: whole on every rank.

Everything here is arithmetic on shapes and names; reading the slices is sharded_load.py's job.
"""

import dataclasses
from dataclasses import dataclass

from pagedllm.errors import InvalidInputError
from pagedllm.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class Shard:
    rank: int
    size: int


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Rows or columns [start, stop) of a weight along `dim`; `padded_len` > stop - start pads with zeros."""

    dim: int
    start: int
    stop: int
    padded_len: int


def check_shardable(config: ModelConfig, size: int) -> None:
    """Raise one line naming the numbers when the model cannot be split over `size` ranks."""
    if size < 1:
        raise InvalidInputError(f"tensor_parallel_size must be a positive integer, got {size}")
    if config.num_heads % size:
        raise InvalidInputError(f"cannot split {config.num_heads} query heads over {size} ranks")
    kv = config.num_kv_heads
    if kv % size and size % kv:
        raise InvalidInputError(
            f"cannot split {kv} KV heads over {size} ranks (one of the two must divide the other)"
        )
    if config.intermediate_size % size:
        raise InvalidInputError(f"cannot split an MLP of width {config.intermediate_size} over {size} ranks")


def local_vocab_size(vocab_size: int, size: int) -> int:
    return -(-vocab_size // size)


def local_config(config: ModelConfig, size: int) -> ModelConfig:
    """The shapes one rank's model has: its heads, its MLP width, its (padded) vocabulary slice."""
    check_shardable(config, size)
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // size,
        num_kv_heads=max(1, config.num_kv_heads // size),
        intermediate_size=config.intermediate_size // size,
        vocab_size=local_vocab_size(config.vocab_size, size),
    )


def vocab_range(config: ModelConfig, shard: Shard) -> tuple[int, int]:
    """Token ids [start, stop) whose embedding rows and logits this rank holds (stop - start may be short)."""
    per_rank = local_vocab_size(config.vocab_size, shard.size)
    start = min(shard.rank * per_rank, config.vocab_size)
    return start, min(start + per_rank, config.vocab_size)


def kv_head_range(config: ModelConfig, shard: Shard) -> tuple[int, int]:
    kv = config.num_kv_heads
    if kv >= shard.size:
        per_rank = kv // shard.size
        return shard.rank * per_rank, (shard.rank + 1) * per_rank
    head = shard.rank * kv // shard.size  # replicated: the KV head of this rank's query heads
    return head, head + 1


def slice_spec(name: str, config: ModelConfig, shard: Shard) -> SliceSpec | None:
    """The slice of weight `name` (HF naming) that `shard` holds; None for a weight every rank holds whole."""
    if shard.size == 1:
        return None
    head_dim, size, rank = config.head_dim, shard.size, shard.rank
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        start, stop = vocab_range(config, shard)
        return SliceSpec(0, start, stop, local_vocab_size(config.vocab_size, size))
    if ".self_attn.q_proj." in name:
        rows = config.num_heads // size * head_dim
        return SliceSpec(0, rank * rows, (rank + 1) * rows, rows)
    if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
        first, last = kv_head_range(config, shard)
        return SliceSpec(0, first * head_dim, last * head_dim, (last - first) * head_dim)
    if ".self_attn.o_proj." in name:
        cols = config.num_heads // size * head_dim
        return SliceSpec(1, rank * cols, (rank + 1) * cols, cols)
    width = config.intermediate_size // size
    if ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
        return SliceSpec(0, rank * width, (rank + 1) * width, width)
    if ".mlp.down_proj." in name:
        return SliceSpec(1, rank * width, (rank + 1) * width, width)
    return None
