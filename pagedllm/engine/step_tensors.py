"""What the runner takes per sequence (SeqInput) and the flat tensors it builds from a step (StepTensors)."""

from dataclasses import dataclass

import torch

from pagedllm.attention import AttentionMetadata


@dataclass(slots=True)
class SeqInput:
    token_ids: list[int]  # the new tokens this step
    num_cached: int  # tokens of this sequence already in the KV cache (their positions come first)
    block_table: list[int]  # covers num_cached + len(token_ids) positions
    needs_logits: bool = True  # False for a non-final prefill chunk
    # Offsets into token_ids whose logits come back too (prompt logprobs): after every sequence's sampling row,
    # in input order.
    prompt_logits: range = range(0)


@dataclass(slots=True)
class StepTensors:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    logits_rows: torch.Tensor  # [S'] int64: last new token of each sequence that needs logits, then prompt_logits
    # Where S' < T: the last layer's attention over only those rows, each one query over its whole context
    # (AttentionMetadata.last_tokens): the other rows' outputs feed nothing after the last layer's K/V.
    logits_meta: AttentionMetadata | None = None
    num_prompt_rows: int = 0  # how many of logits_rows (the last ones) are prompt_logits rows

    @property
    def every_row(self) -> bool:
        """Whether logits_rows are all the step's rows in order (a decode step's): its hidden states need no cut."""
        return self.num_prompt_rows == 0 and self.logits_rows.numel() == self.input_ids.numel()
