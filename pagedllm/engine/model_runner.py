"""ModelRunner: turns one scheduler step (a mixed batch of prefill chunks and decode tokens) into flat
tensors, runs the model once over all of it, and returns logits for the positions that will be sampled.

The weights and the KV pool live on the runner's device; per step the index tensors cross to it in one
copy (pinned, non-blocking on CUDA) and the logits stay there for the sampler."""

import itertools
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedllm.attention import AttentionMetadata, allocate_kv_caches, copy_blocks, resolve_attention_impl
from pagedllm.attention.compiled import compiled_copy_blocks
from pagedllm.engine.device import current, to_device_packed
from pagedllm.engine.host_memory import keep_freed_memory
from pagedllm.engine.pool_memory import check_pool_fits, pool_bytes
from pagedllm.errors import InvalidInputError
from pagedllm.engine.step_logits import StepLogits
from pagedllm.engine.step_tensors import SeqInput, StepTensors
from pagedllm.model.config import ModelConfig
from pagedllm.kv.block_table import blocks_needed

if TYPE_CHECKING:
    from pagedllm.engine.cuda_graphs import DecodeGraphs

__all__ = ["ModelRunner", "SeqInput", "StepTensors"]



class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        attention_impl: str = "auto",
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise InvalidInputError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.model, self.config = model, config
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device = torch.device(device)
        self.attention_impl = resolve_attention_impl(attention_impl, config.head_dim, dtype, self.device)
        if self.device.type == "cpu":
            check_pool_fits(pool_bytes(config, num_blocks, block_size, dtype))
        self.kv_caches: list[torch.Tensor] = allocate_kv_caches(
            config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype, self.device
        )
        self.graphs: "DecodeGraphs | None" = None  # CUDA graphs of decode-only steps, once capture_graphs() ran
        if self.device.type == "cpu":  # every CPU engine and tensor-parallel rank steps through a runner
            keep_freed_memory()

    def capture_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        """Capture decode-only steps as CUDA graphs at padded batch sizes (CUDA with the Triton attention only)."""
        from pagedllm.engine.cuda_graphs import DecodeGraphs

        with current(self.device):
            self.graphs = DecodeGraphs(self, max_num_seqs, max_model_len)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Each (src, dst): every layer's K and V of block src into dst. The copies are independent: the paths
        copy in different orders, so a block that is both a source and a destination is refused."""
        if not copies:
            return
        chained = {src for src, _ in copies} & {dst for _, dst in copies}
        if chained:
            raise InvalidInputError(f"blocks {sorted(chained)} are both copied from and copied into in one step")
        with current(self.device):
            self._copy_blocks(copies)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if self.attention_impl == "compiled":
            compiled_copy_blocks(self.kv_caches, copies)
        elif self.attention_impl == "triton":  # CPU tensors too under the interpreter (the tests)
            from pagedllm.attention.triton import triton_copy_blocks

            triton_copy_blocks(self.kv_caches, copies)
        else:
            copy_blocks(self.kv_caches, copies)

    def execute(self, seqs: list[SeqInput]) -> torch.Tensor:
        """float32 logits on the device: a row per seq with needs_logits, in input order, then the seqs'
        prompt_logits rows."""
        if not seqs:
            return torch.empty(0, self.config.vocab_size, device=self.device)
        step = self.prepare(seqs)
        with torch.inference_mode(), current(self.device):
            if self.graphs is not None and self.graphs.covers(step):
                return self.graphs.replay(step)
            return self.forward(step)

    def execute_greedy(self, seqs: list[SeqInput]) -> StepLogits:
        """execute() for a step whose every logits row needs only its greedy pick: where the LM head can, the picks
        and their raw logprobs come from its own pass and the [rows, vocab] logits are never made (a row whose
        logits are not all finite takes the full logits instead)."""
        if not seqs:
            return StepLogits.dense(self.execute(seqs))
        step = self.prepare(seqs)
        with torch.inference_mode(), current(self.device):
            if self.graphs is not None and self.graphs.covers(step):
                return StepLogits.dense(self.graphs.replay(step))
            hidden = self.hidden_states(step)
            picks = self.model.greedy_picks(hidden)
            logits = None if picks is None else StepLogits.greedy_picks(*picks)
            if logits is None:
                return StepLogits.dense(self.model.compute_logits(hidden))
        return logits

    def forward(self, step: "StepTensors") -> torch.Tensor:
        """The model over one step's device tensors: logits of step.logits_rows."""
        return self.model.compute_logits(self.hidden_states(step))

    def hidden_states(self, step: "StepTensors") -> torch.Tensor:
        """The model's last hidden states at step.logits_rows."""
        rows = None if step.every_row else step.logits_rows
        return self.model(step.input_ids, step.positions, self.kv_caches, step.meta, self.attention_impl, rows,
                          step.logits_meta)

    def prepare(self, seqs: list[SeqInput]) -> StepTensors:
        """All of the step's tensors, built once on the host (the layers share them), then sent in one copy."""
        query_lens = [len(s.token_ids) for s in seqs]
        num_cached = [s.num_cached for s in seqs]
        for s, q in zip(seqs, query_lens):
            self._check(s, q)
        meta = AttentionMetadata.build([s.block_table for s in seqs], num_cached, query_lens, self.block_size)
        # on the host in numpy, whose ops on a few dozen ints cost a third of torch's (every step builds these)
        starts = meta.query_start_loc.numpy()
        num_tokens = int(starts[-1])
        # position of token j of sequence i = num_cached_i + (j - start_i)
        offsets = np.repeat(np.array(num_cached, dtype=np.int64) - starts[:-1], query_lens)
        positions = np.arange(num_tokens, dtype=np.int64) + offsets
        sampled = [i for i, s in enumerate(seqs) if s.needs_logits]
        tokens = itertools.chain.from_iterable(s.token_ids for s in seqs)
        input_ids = np.fromiter(tokens, dtype=np.int64, count=num_tokens)
        logits_rows = starts[np.array(sampled, dtype=np.int64) + 1] - 1
        prompt_rows = [starts[i] + np.arange(s.prompt_logits.start, s.prompt_logits.stop, dtype=np.int64)
                       for i, s in enumerate(seqs) if s.prompt_logits]  # fmt: skip
        if prompt_rows:
            logits_rows = np.concatenate([logits_rows, *prompt_rows])
        step = StepTensors(torch.from_numpy(input_ids), torch.from_numpy(positions), meta,
                           torch.from_numpy(logits_rows), num_prompt_rows=len(logits_rows) - len(sampled))
        if len(sampled) < num_tokens and not prompt_rows:  # one row per sequence: the last layer can cut to them
            step.logits_meta = meta.last_tokens(sampled)
        return self._to_device(step)

    def _to_device(self, host: StepTensors) -> StepTensors:
        """One host -> device copy of every index tensor of the step (packed into one int64 buffer)."""
        metas = [m for m in (host.meta, host.logits_meta) if m is not None]
        parts = [host.input_ids, host.positions, host.logits_rows]
        for meta in metas:
            parts += [meta.slot_mapping, meta.block_tables.reshape(-1), meta.seq_lens, meta.query_start_loc]
        pieces = iter(to_device_packed(parts, self.device, "step inputs"))
        ids, positions, rows = next(pieces), next(pieces), next(pieces)
        metas = [
            replace(meta, slot_mapping=next(pieces), block_tables=next(pieces).view(meta.block_tables.shape),
                    seq_lens=next(pieces), query_start_loc=next(pieces))
            for meta in metas
        ]
        return StepTensors(ids, positions, metas[0], rows, metas[1] if len(metas) > 1 else None, host.num_prompt_rows)

    def _check(self, seq: SeqInput, query_len: int) -> None:
        if query_len == 0:
            raise InvalidInputError("a SeqInput must carry at least one new token")
        if seq.prompt_logits and not (0 <= seq.prompt_logits.start < seq.prompt_logits.stop <= query_len):
            raise InvalidInputError(f"prompt_logits {seq.prompt_logits} is not within the {query_len} new tokens")
        needed = blocks_needed(seq.num_cached + query_len, self.block_size)
        if len(seq.block_table) < needed:
            raise InvalidInputError(
                f"block table of {len(seq.block_table)} blocks cannot hold {seq.num_cached + query_len} tokens"
            )
