"""What one scheduler step decided: which sequences advance by how many tokens, and the block copies to make first."""

from dataclasses import dataclass, field

from pagedllm.engine.request import Request, Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    request: Request
    num_new_tokens: int
    num_cached: int = 0  # tokens already in the cache when the step starts
    block_table: list[int] = field(default_factory=list)  # filled once the step is final
    needs_logits: bool = False  # this step computes the sequence's last known token: sample after it

    def __post_init__(self) -> None:
        self.num_cached = self.seq.num_computed
        self.needs_logits = self.num_cached + self.num_new_tokens == len(self.seq.token_ids)

    @property
    def new_token_ids(self) -> list[int]:
        return self.seq.token_ids[self.num_cached : self.num_cached + self.num_new_tokens]

    @property
    def num_prompt_tokens(self) -> int:
        """How many of this step's tokens are prompt tokens (the rest recompute earlier output)."""
        return max(0, min(self.num_cached + self.num_new_tokens, self.seq.num_prompt_tokens) - self.num_cached)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    cow: list[tuple[Request, int, int]] = field(default_factory=list)  # copy-on-write (owner, src, dst)
    preempted: list[Request] = field(default_factory=list)

    @property
    def copies(self) -> list[tuple[int, int]]:
        return [(src, dst) for _, src, dst in self.cow]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def logits_seqs(self) -> list[ScheduledSeq]:
        """The sequences that get a logits row, in row order."""
        return [s for s in self.scheduled if s.needs_logits]
