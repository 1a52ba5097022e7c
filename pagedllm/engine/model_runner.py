"""ModelRunner: turns one scheduler step (a mixed batch of prefill chunks and decode tokens) into flat
tensors, runs the model once over all of it, and returns logits for the positions that will be sampled."""

import itertools
import logging
from dataclasses import dataclass

import torch

from pagedllm.attention import AttentionMetadata, allocate_kv_caches, copy_blocks, kv_cache_bytes_per_block
from pagedllm.attention.compiled import compiled_copy_blocks
from pagedllm.config import parse_memory_size  # noqa: F401  (one parser for the whole project; re-exported)
from pagedllm.errors import InvalidInputError
from pagedllm.model.config import ModelConfig

logger = logging.getLogger("pagedllm")


@dataclass(slots=True)
class SeqInput:
    token_ids: list[int]  # the new tokens this step
    num_cached: int  # tokens of this sequence already in the KV cache (their positions come first)
    block_table: list[int]  # covers num_cached + len(token_ids) positions
    needs_logits: bool = True  # False for a non-final prefill chunk


@dataclass(slots=True)
class StepTensors:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    logits_rows: torch.Tensor  # [S'] int64: last new token of each sequence that needs logits


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        attention_impl: str = "auto",
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise InvalidInputError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.model, self.config = model, config
        self.num_blocks, self.block_size = num_blocks, block_size
        self.attention_impl = resolve_attention_impl(attention_impl, config.head_dim, dtype)
        self.kv_caches: list[torch.Tensor] = allocate_kv_caches(
            config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype
        )

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        if self.attention_impl == "compiled":
            compiled_copy_blocks(self.kv_caches, copies)
        else:
            copy_blocks(self.kv_caches, copies)

    def execute(self, seqs: list[SeqInput]) -> torch.Tensor:
        """float32 logits [number of seqs with needs_logits, vocab], in input order."""
        if not seqs:
            return torch.empty(0, self.config.vocab_size)
        step = self.prepare(seqs)
        with torch.inference_mode():
            hidden = self.model(step.input_ids, step.positions, self.kv_caches, step.meta, self.attention_impl)
            return self.model.compute_logits(hidden[step.logits_rows])

    def prepare(self, seqs: list[SeqInput]) -> StepTensors:
        """All of the step's tensors, built once (the layers share them)."""
        query_lens = [len(s.token_ids) for s in seqs]
        num_cached = [s.num_cached for s in seqs]
        for s, q in zip(seqs, query_lens):
            self._check(s, q)
        meta = AttentionMetadata.build([s.block_table for s in seqs], num_cached, query_lens, self.block_size)
        starts = meta.query_start_loc[:-1]
        lens = torch.tensor(query_lens, dtype=torch.int64)
        # position of token j of sequence i = num_cached_i + (j - start_i)
        offsets = torch.repeat_interleave(torch.tensor(num_cached, dtype=torch.int64) - starts, lens)
        positions = torch.arange(int(meta.query_start_loc[-1]), dtype=torch.int64) + offsets
        wanted = torch.tensor([s.needs_logits for s in seqs], dtype=torch.bool)
        input_ids = torch.tensor(list(itertools.chain.from_iterable(s.token_ids for s in seqs)), dtype=torch.int64)
        return StepTensors(input_ids, positions, meta, meta.query_start_loc[1:][wanted] - 1)

    def _check(self, seq: SeqInput, query_len: int) -> None:
        if query_len == 0:
            raise InvalidInputError("a SeqInput must carry at least one new token")
        needed = -(-(seq.num_cached + query_len) // self.block_size)
        if len(seq.block_table) < needed:
            raise InvalidInputError(
                f"block table of {len(seq.block_table)} blocks cannot hold {seq.num_cached + query_len} tokens"
            )


def resolve_attention_impl(impl: str, head_dim: int, dtype: torch.dtype) -> str:
    """Validate early (at construction, not mid-step) and decide what "auto" means for this model here:
    the compiled kernels when they loaded and cover the head size and dtype, else the torch path."""
    from pagedllm.attention import IMPLS
    from pagedllm.attention.compiled import compiled_covers
    from pagedllm.kernels import load_cpu_kernels

    if impl not in IMPLS:
        raise InvalidInputError(f"unknown attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if impl not in ("auto", "compiled"):
        return impl
    if compiled_covers(head_dim, dtype):
        return "compiled"
    if impl == "compiled":
        raise InvalidInputError(f"the compiled CPU kernels are unavailable for head_dim {head_dim}, {dtype} here")
    if load_cpu_kernels() is not None:
        logger.info("compiled kernels have no path for head_dim %d / %s; using the torch attention", head_dim, dtype)
    return "fast"


def num_blocks_for_memory(config: ModelConfig, block_size: int, dtype: torch.dtype, budget: str | int) -> int:
    """How many KV blocks fit in a memory budget (all layers, K and V)."""
    per_block = kv_cache_bytes_per_block(config.num_layers, block_size, config.num_kv_heads, config.head_dim, dtype)
    num_blocks = parse_memory_size(budget) // per_block
    if num_blocks < 1:
        raise InvalidInputError(f"KV cache budget {budget} is smaller than one block ({per_block} bytes)")
    return num_blocks
