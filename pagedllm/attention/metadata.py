"""The one object the model receives about the batch's KV layout (the model never sees a block table otherwise)."""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class AttentionMetadata:
    """A mixed batch of prefill and decode sequences, flattened token-major.

    Sequence i owns query rows query_start_loc[i]:query_start_loc[i+1]; those rows are its new tokens,
    at positions num_cached_i .. seq_lens[i]-1 where num_cached_i = seq_lens[i] - query_len_i. Each new
    token attends causally to every cached token and to the new tokens up to itself.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset; -1 = do not write
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0 past each sequence's blocks
    seq_lens: torch.Tensor  # [num_seqs] int64: context length after this step (cached + new)
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64: cumulative new-token counts
    block_size: int
    seq_lens_list: list[int]  # host copies, so ops need no .tolist() per layer
    query_lens_list: list[int]
    plan: object | None = None  # per-step work list an implementation derives once and reuses in every layer

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    def last_tokens(self, seqs: list[int]) -> "AttentionMetadata":
        """The batch cut to the last new token of sequences `seqs` (host tensors): one query row each, over its
        whole context. For attending after this batch's K/V are written: its slots are those tokens'."""
        index = torch.tensor(seqs, dtype=torch.int64)
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[self.query_start_loc[index + 1] - 1],
            block_tables=self.block_tables[index],
            seq_lens=self.seq_lens[index],
            query_start_loc=torch.arange(len(seqs) + 1, dtype=torch.int64),
            block_size=self.block_size,
            seq_lens_list=[self.seq_lens_list[i] for i in seqs],
            query_lens_list=[1] * len(seqs),
        )

    @classmethod
    def build(
        cls,
        block_tables: list[list[int]],
        num_cached: list[int],
        query_lens: list[int],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> "AttentionMetadata":
        """Build the flat tensors from per-sequence host lists (block tables must cover seq_len)."""
        seq_lens = [c + q for c, q in zip(num_cached, query_lens)]
        slots: list[int] = []
        for table, start, end in zip(block_tables, num_cached, seq_lens):
            slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, end))
        width = max((len(t) for t in block_tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in block_tables]
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        return cls(
            slot_mapping=_as_long(slots, device),
            block_tables=_as_long(padded, device).reshape(len(block_tables), width),
            seq_lens=_as_long(seq_lens, device),
            query_start_loc=_as_long(starts, device),
            block_size=block_size,
            seq_lens_list=seq_lens,
            query_lens_list=list(query_lens),
        )


def _as_long(values: list, device: torch.device | str) -> torch.Tensor:
    """A (nested) list of ints as an int64 tensor: through numpy, which reads a list of block tables three times
    as fast as torch.tensor (a decode step builds one every step)."""
    tensor = torch.from_numpy(np.array(values, dtype=np.int64))
    return tensor if torch.device(device).type == "cpu" else tensor.to(device)
