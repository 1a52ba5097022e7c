"""A request and its sequences: the scheduler's per-request state."""

import enum
import time
from dataclasses import dataclass, field

from pagedllm.engine.completion import Completion, completion_output
from pagedllm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from pagedllm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One completion (or one beam): prompt + output token ids and how many of them are in the KV cache.

    Only the scheduler writes these fields. The output side (text, logprobs, sampling randomness) is
    in `completion`, written by the output stages; beams have none (their text comes at the end)."""

    seq_id: int  # one engine-wide counter; the KV manager keys block tables by it
    token_ids: list[int]
    num_prompt_tokens: int
    index: int = 0  # completion index (0..n-1), or the beam id under beam search
    num_computed: int = 0  # tokens whose K/V are in the cache
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    completion: Completion | None = None

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_total_len: int  # prompt + output never grows past this (max_tokens, model length)
    extra_keys: tuple = ()  # change the KV identity for prefix caching (cache salt)
    bad_word_spellings: list[list[int]] = field(default_factory=list)  # params.bad_words as token ids
    grammar: object | None = None  # params.structured_outputs compiled (engine/grammar.py)
    seqs: list[Sequence] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=time.time()))
    arrival_index: int = 0  # order of arrival; breaks ties between equal arrival times
    priority: int = 0  # scheduling_policy="priority": lower goes first (then arrival)
    beam: object | None = None  # BeamSearch state when params.use_beam_search
    final_outputs: list[CompletionOutput] | None = None  # set when beam search ends
    prompt_logprobs: list[TokenLogprob | None] | None = None  # when asked: [None] first, then one per token

    def __post_init__(self) -> None:
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    @property
    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def width(self) -> int:
        """Sequences the request grows to: n, or the beam width."""
        return self.params.beam_width if self.params.use_beam_search else self.params.n

    @property
    def never_preempted(self) -> bool:
        """Its admission, if any, is its first: what the prefix cache gives it now is counted as its hit."""
        return self.metrics.num_preemptions == 0

    @property
    def needs_prompt_logits(self) -> bool:
        """Whether prompt logprobs were asked for and some are still to be computed."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def num_prompt_positions_done(self) -> int:
        """Positions whose logits gave their prompt logprob (position p gives token p + 1's)."""
        return 0 if self.prompt_logprobs is None else len(self.prompt_logprobs) - 1

    @property
    def is_fresh(self) -> bool:
        """Still before its first sampled token: one sequence, the prompt only."""
        return len(self.seqs) == 1 and len(self.seqs[0].token_ids) == self.seqs[0].num_prompt_tokens

    def output(self) -> RequestOutput:
        """Everything so far, plus what is new since the previous call (the `new_*` fields)."""
        if self.params.use_beam_search:
            outputs = self.final_outputs or []
        else:
            outputs = [completion_output(s.completion, s) for s in sorted(self.seqs, key=lambda s: s.index)]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=self.finished,
            metrics=self.metrics,
            prompt_logprobs=None if self.prompt_logprobs is None else list(self.prompt_logprobs),
        )
