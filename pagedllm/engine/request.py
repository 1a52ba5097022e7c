"""A request and its sequences: the engine's per-request state."""

import enum
import time
from dataclasses import dataclass, field

import torch

from pagedllm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from pagedllm.sampling_params import SamplingParams


def seq_id(request_id: str, number: int) -> str:
    """Sequence ids are "<request id>#<number>": the KV manager keys blocks by them."""
    return f"{request_id}#{number}"


def split_seq_id(seq_id: str) -> tuple[str, int]:
    request_id, number = seq_id.rsplit("#", 1)
    return request_id, int(number)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One completion (or one beam): prompt + output token ids and how many of them are in the KV cache."""

    seq_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    index: int = 0
    num_computed: int = 0  # tokens whose K/V are in the cache
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str = ""
    detokenizer: object | None = None  # IncrementalDetokenizer
    generator: torch.Generator | None = None  # this completion's sampling randomness

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.text,
            token_ids=list(self.output_ids),
            logprobs=None if self.logprobs is None else list(self.logprobs),
            finish_reason=self.finish_reason,
            cumulative_logprob=self.cumulative_logprob,
            stop_reason=self.stop_reason,
        )


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_total_len: int  # prompt + output never grows past this (max_tokens, model length)
    extra_keys: tuple = ()  # change the KV identity for prefix caching (cache salt)
    seqs: list[Sequence] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=time.time()))
    beam: object | None = None  # BeamSearch state when params.use_beam_search
    final_outputs: list[CompletionOutput] | None = None  # set when beam search ends
    next_seq_number: int = 0

    @property
    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_fresh(self) -> bool:
        """Still before its first sampled token: one sequence, the prompt only."""
        return len(self.seqs) == 1 and len(self.seqs[0].token_ids) == self.seqs[0].num_prompt_tokens

    def next_number(self) -> int:
        """A fresh sequence number within this request (0 is the first sequence)."""
        number = self.next_seq_number
        self.next_seq_number += 1
        return number

    def new_seq_id(self) -> str:
        return seq_id(self.request_id, self.next_number())

    def output(self) -> RequestOutput:
        if self.final_outputs is not None:
            outputs = self.final_outputs
        else:
            outputs = [s.completion() for s in sorted(self.seqs, key=lambda s: s.index)]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=self.finished,
            metrics=self.metrics,
        )
