"""What a tensor-parallel rank's model needs to know: how to sum a tensor over the ranks, and which slice
of the vocabulary its embedding and lm_head rows hold (see pagedllm/distributed/sharding.py)."""

from collections.abc import Callable
from dataclasses import dataclass

import torch


def no_reduce(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    all_reduce: Callable[[torch.Tensor], torch.Tensor]  # in-place sum over the ranks; returns its argument
    vocab_start: int  # token ids [vocab_start, vocab_stop) are this rank's embedding rows / logits columns
    vocab_stop: int
