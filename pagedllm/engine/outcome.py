"""What the output stage found in one step's logits, for the detokenizer to turn into text and the
scheduler to apply. Plain data: nothing here changes a sequence."""

from dataclasses import dataclass, field

from pagedllm.engine.beam import BeamStep
from pagedllm.engine.completion import Completion
from pagedllm.engine.request import Request, Sequence


@dataclass(slots=True)
class SampledToken:
    request: Request
    seq: Sequence  # the sequence that gets the token; with `fork`, the parent that the new one copies
    completion: Completion  # the receiving sequence's completion (a new one for a fork)
    token_id: int
    logprob: float
    top_logprobs: dict[int, float] | None
    fork: bool = False  # n > 1: a new sequence forks `seq` (before `seq` gets its own token) and gets this one
    finish_reason: str | None = None  # "stop", "length" or "repetition" when this token ends the sequence
    stop_reason: int | str | None = None
    rank: int | None = None  # the token's rank in the vocabulary, where logprobs are asked for


@dataclass(slots=True)
class BeamChoice:
    request: Request
    step: BeamStep  # which beams fork, end and continue (beam id = Sequence.index)


@dataclass(slots=True)
class StepOutcome:
    tokens: list[SampledToken] = field(default_factory=list)
    beams: list[BeamChoice] = field(default_factory=list)
    sampled: list[Request] = field(default_factory=list)  # requests that got a logits row this step

    @property
    def num_generated(self) -> int:
        """Tokens this step added: sampled ones, and each beam's (those that go on and those that ended)."""
        return len(self.tokens) + sum(len(b.step.live) + b.step.num_finished for b in self.beams)
