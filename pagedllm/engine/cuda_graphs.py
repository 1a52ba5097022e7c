"""CUDA graphs for decode-only steps: the whole forward pass of one token per sequence, replayed by one call.

A decode step launches a few kernels per layer, each too short to hide the CPU's launch cost; a CUDA
graph records the launches once and replays them together. A graph is captured per padded batch size
(1, 2, 4, then multiples of 8 up to max_num_seqs); a step of n sequences copies its device tensors into
static buffers (device to device), pads them to the next size and replays. Padding rows write no K/V
(slot -1) and attend to one key of block 0; their logits are dropped.

Only decode-only steps with the Triton attention replay a graph (its decode plan is fixed per batch size:
decode_only_plan); prefill and mixed steps run eagerly. enforce_eager=True captures nothing.

capture=False runs the same padded static step eagerly instead of replaying a graph: the tests check the
padding and the fixed plan that way on the CPU (Triton interpreter), where no graph can be captured.
"""

import logging
import time
from typing import Protocol

import torch

from pagedllm.attention.metadata import AttentionMetadata
from pagedllm.attention.triton.attention import decode_only_plan
from pagedllm.engine.step_tensors import StepTensors
from pagedllm.kv.block_table import blocks_needed
from pagedllm.model.config import ModelConfig



class GraphRunner(Protocol):
    """What the graphs need of the ModelRunner that owns them."""

    attention_impl: str
    device: torch.device
    block_size: int
    kv_caches: list[torch.Tensor]
    config: ModelConfig

    def forward(self, step: StepTensors) -> torch.Tensor: ...

logger = logging.getLogger("pagedllm")


def padded_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, ... up to the first size that holds max_num_seqs."""
    sizes = [1, 2, 4] + list(range(8, max_num_seqs + 8, 8))
    return [s for s in sizes if s < max_num_seqs] + [next(s for s in sizes if s >= max_num_seqs)]


def fits(step: StepTensors, largest: int, width: int) -> bool:
    """A decode-only step (one new token and one logits row per sequence) within `largest` sequences and
    `width` block-table columns."""
    meta = step.meta
    return (
        meta.num_seqs <= largest
        and all(q == 1 for q in meta.query_lens_list)
        and step.logits_rows.numel() == meta.num_seqs
        and step.num_prompt_rows == 0
        and meta.block_tables.shape[1] <= width
    )


class DecodeGraphs:
    def __init__(self, runner: GraphRunner, max_num_seqs: int, max_model_len: int, capture: bool = True) -> None:
        if runner.attention_impl != "triton" or (capture and runner.device.type != "cuda"):
            raise ValueError("CUDA graphs need the runner on CUDA with the Triton attention")
        self.runner, self.max_model_len = runner, max_model_len
        self.sizes = padded_sizes(max_num_seqs)
        self.width = blocks_needed(max_model_len, runner.block_size)  # block-table columns
        largest, device = self.sizes[-1], runner.device
        long = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(largest, **long)
        self.positions = torch.zeros(largest, **long)
        self.slot_mapping = torch.full((largest,), -1, **long)
        self.block_tables = torch.zeros(largest, self.width, **long)
        self.seq_lens = torch.ones(largest, **long)
        self.query_start_loc = torch.arange(largest + 1, **long)
        self.steps = {size: self._static_step(size) for size in self.sizes}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            self._capture_all()

    def covers(self, step: StepTensors) -> bool:
        return fits(step, self.sizes[-1], self.width)

    def replay(self, step: StepTensors) -> torch.Tensor:
        """Logits [n, vocab]: a view of the graph's output buffer, valid until the next replay."""
        n, meta = step.meta.num_seqs, step.meta
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(step.input_ids)
        self.positions[:n].copy_(step.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:size].fill_(1)
        if size not in self.graphs:
            return self.runner.forward(self.steps[size])[:n]
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:n]

    def _static_step(self, size: int) -> StepTensors:
        """The first `size` rows of the static buffers as a decode step, with its fixed attention plan."""

        meta = AttentionMetadata(
            self.slot_mapping[:size], self.block_tables[:size], self.seq_lens[:size],
            self.query_start_loc[: size + 1], self.runner.block_size, [self.max_model_len] * size, [1] * size,
        )
        kv_cache = self.runner.kv_caches[0]
        meta.plan = decode_only_plan(size, self.max_model_len, self.runner.config.num_heads, kv_cache)
        return StepTensors(self.input_ids[:size], self.positions[:size], meta, self.query_start_loc[:size])

    def _capture_all(self) -> None:
        """Every size, largest first (the smaller graphs reuse its memory); logs the time and memory taken,
        which the pool sizing did not count."""
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.runner.device)
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            self.graphs[size] = self._capture(self.steps[size], pool)
        logger.info(
            "CUDA graphs for decode batches of %s captured in %.1f s, %.0f MiB",
            ", ".join(map(str, self.sizes)), time.perf_counter() - start,
            (torch.cuda.memory_reserved(self.runner.device) - reserved) / 2**20,
        )

    def _capture(self, step: StepTensors, pool: object) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        with torch.inference_mode():
            self.runner.forward(step)  # compiles the kernels outside the capture
            torch.cuda.synchronize(self.runner.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self.runner.forward(step)
        return graph, logits
