"""The one message per step that rank 0 sends every worker: what to swap, what to copy, what to run.

Encoded as a flat list of integers (sent as one int64 tensor) so that a step costs one broadcast:

    [kind, #copies, #swaps, #seqs, #logits rows]
    copies:  src, dst                                            (per copy)
    swaps:   op, seq id, #tokens, #blocks, blocks...             (per swap operation, in the order made)
    seqs:    #new tokens, #cached, needs logits, prompt logits start, stop, #blocks, tokens..., block table...
                                                                 (per sequence)
    rows:    1 where a logits row is only needed for its greedy pick, else 0           (per logits row)
"""

from dataclasses import dataclass, field
from enum import IntEnum

from pagedllm.engine.model_runner import SeqInput


class Kind(IntEnum):
    STEP = 1
    HEARTBEAT = 2  # nothing to do: keeps an idle worker's wait inside the timeout
    STOP = 3


class SwapOp(IntEnum):
    SAVE = 1
    RESTORE = 2
    DROP = 3


@dataclass(slots=True)
class SwapCall:
    op: SwapOp
    seq_id: int
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0


@dataclass(slots=True)
class StepMessage:
    kind: Kind
    copies: list[tuple[int, int]] = field(default_factory=list)
    swaps: list[SwapCall] = field(default_factory=list)
    seqs: list[SeqInput] = field(default_factory=list)
    greedy_rows: list[bool] = field(default_factory=list)


def encode(msg: StepMessage) -> list[int]:
    words = [int(msg.kind), len(msg.copies), len(msg.swaps), len(msg.seqs), len(msg.greedy_rows)]
    for src, dst in msg.copies:
        words += (src, dst)
    for call in msg.swaps:
        words += (int(call.op), call.seq_id, call.num_tokens, len(call.blocks), *call.blocks)
    for seq in msg.seqs:
        words += (len(seq.token_ids), seq.num_cached, int(seq.needs_logits), seq.prompt_logits.start,
                  seq.prompt_logits.stop, len(seq.block_table))
        words += seq.token_ids
        words += seq.block_table
    words += map(int, msg.greedy_rows)
    return words


def decode(words: list[int]) -> StepMessage:
    reader = _Reader(words)
    kind, num_copies, num_swaps, num_seqs, num_rows = reader.take(5)
    msg = StepMessage(Kind(kind))
    msg.copies = [tuple(reader.take(2)) for _ in range(num_copies)]
    for _ in range(num_swaps):
        op, seq_id, num_tokens, num_blocks = reader.take(4)
        msg.swaps.append(SwapCall(SwapOp(op), seq_id, reader.take(num_blocks), num_tokens))
    for _ in range(num_seqs):
        num_new, num_cached, needs_logits, prompt_start, prompt_stop, num_blocks = reader.take(6)
        tokens, table = reader.take(num_new), reader.take(num_blocks)
        msg.seqs.append(SeqInput(tokens, num_cached, table, bool(needs_logits), range(prompt_start, prompt_stop)))
    msg.greedy_rows = [bool(w) for w in reader.take(num_rows)]
    if reader.pos != len(words):
        raise ValueError(f"step message has {len(words) - reader.pos} words past its end")
    return msg


class _Reader:
    def __init__(self, words: list[int]) -> None:
        self.words, self.pos = words, 0

    def take(self, n: int) -> list[int]:
        if self.pos + n > len(self.words):
            raise ValueError("step message ends early")
        part = self.words[self.pos : self.pos + n]
        self.pos += n
        return part
