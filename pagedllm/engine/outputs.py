"""What the engine hands back: per request, its n completions so far (and what each step added) and its metrics."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float]  # the top-k alternatives (token id -> logprob), k = SamplingParams.logprobs


@dataclass(slots=True)
class CompletionOutput:
    index: int  # 0..n-1
    text: str  # detokenized text so far (stop strings removed)
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None  # one entry per token when asked for
    finish_reason: str | None  # None while running; "stop", "length" or "abort" when done
    cumulative_logprob: float = 0.0
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    # What this output adds to the previous output of the same completion (streaming reads these):
    new_text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # wall time each output token was produced
    finished_time: float | None = None
    num_cached_prompt_tokens: int = 0  # prompt tokens the prefix cache served when it was first admitted
    num_preemptions: int = 0


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    # SamplingParams.prompt_logprobs: None for the first prompt token, then each one's logprob and top-k
    prompt_logprobs: list[TokenLogprob | None] | None = None
