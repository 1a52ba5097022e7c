"""One step's logits, as far as sampling needs them.

A row that only needs its greedy token (greedy, no logprobs, no penalties, no min_tokens masking) may arrive as
that token and its raw logprob alone. On one process that happens when every row of the step is such a row
and the LM head can pick them in its own pass (ModelRunner.execute_greedy); else every row is a full [vocab]
row. Under tensor parallelism each rank holds a slice of the vocabulary, and such rows are reduced on the
ranks to their pick: rank 0 never sees the whole row.
"""

import math
from dataclasses import dataclass, field

import torch

from pagedllm.engine.device import to_device, to_host
from pagedllm.engine.sampler import SampleResult, SamplingRow, changes_logits


@dataclass(slots=True)
class StepLogits:
    full: torch.Tensor  # [rows with full logits, vocab] float32
    full_index: list[int]  # logits row -> its row in `full`, or -1 for a row known only by its greedy pick
    greedy: dict[int, SampleResult] = field(default_factory=dict)  # logits row -> greedy token, raw logprob

    @classmethod
    def dense(cls, logits: torch.Tensor) -> "StepLogits":
        return cls(logits, list(range(logits.shape[0])))

    @classmethod
    def greedy_picks(cls, tokens: torch.Tensor, logprobs: torch.Tensor) -> "StepLogits | None":
        """Every row known only by its greedy token and raw logprob ([rows] each, where the head ran): one copy
        back, as the sampler's (float64 holds the ids exactly and the float32 logprobs unchanged). None where a
        row's logprob is NaN: its logits are not all finite, and the full logits decide (checked on the host lists,
        where it costs less than a pass over the tensor)."""
        host = to_host(torch.stack([tokens.double(), logprobs.double()]), "sampled tokens")
        picks = [SampleResult(int(t), lp, None) for t, lp in zip(*host.tolist())]
        if any(math.isnan(p.logprob) for p in picks):
            return None
        return cls(logprobs.new_empty(0, 0), [-1] * len(picks), dict(enumerate(picks)))

    def rows(self, rows: list[int]) -> torch.Tensor:
        """Full logits of these rows; every one of them must have been sent whole."""
        index = [self.full_index[r] for r in rows]
        if any(i < 0 for i in index):
            raise ValueError("a row reduced to its greedy pick was asked for its full logits")
        if index == list(range(self.full.shape[0])):
            return self.full
        # the rows' index crosses to the device only when it is not simply every row in order
        return self.full[to_device(torch.tensor(index, dtype=torch.long), self.full.device, "sampling rows")]


def greedy_only(row: SamplingRow) -> bool:
    """Whether sampling this row needs nothing but the raw argmax and its logprob (a grammar masks the logits
    first)."""
    return row.params.greedy and row.params.num_logprobs is None and row.grammar is None and not changes_logits(row)
