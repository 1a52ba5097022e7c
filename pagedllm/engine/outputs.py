"""What the engine hands back: per request, its n completions so far (and what each step added) and its metrics."""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Logprob:
    """One token's entry in vLLM's shape."""

    logprob: float
    rank: int | None = None  # in the vocabulary, 1 = the likeliest
    decoded_token: str | None = None


@dataclass(slots=True, eq=False)
class TokenLogprob(Mapping[int, Logprob]):
    """A token's logprob and its top-k alternatives. Also readable as vLLM's dict of token id -> Logprob: the
    token itself first, then the alternatives best first (ranks 1..k); it compares equal to that dict."""

    token_id: int
    logprob: float
    # the top-k alternatives (token id -> logprob), k = SamplingParams.logprobs; or logprob_token_ids' tokens, in order
    top: dict[int, float]
    rank: int | None = None  # the token's rank in the vocabulary (how many tokens are at least as likely)
    text_of: Callable[[int], str] | None = field(default=None, repr=False, compare=False)  # a token's text

    def __getitem__(self, token_id: int) -> Logprob:
        if token_id == self.token_id:
            value, rank = self.logprob, self.rank
        elif token_id in self.top:
            value, rank = self.top[token_id], list(self.top).index(token_id) + 1
        else:
            raise KeyError(token_id)
        return Logprob(value, rank, self.text_of(token_id) if self.text_of is not None else None)

    def __reduce__(self) -> tuple:
        """Pickled and copied with its tokens' texts, not with the tokenizer that gives them."""
        texts = None if self.text_of is None else {token: self.text_of(token) for token in self}
        return TokenLogprob, (self.token_id, self.logprob, self.top, self.rank, None if texts is None else texts.get)

    def __iter__(self) -> Iterator[int]:
        yield self.token_id
        yield from (token for token in self.top if token != self.token_id)

    def __len__(self) -> int:
        return len(self.top) + (self.token_id not in self.top)


@dataclass(slots=True)
class CompletionOutput:
    index: int  # 0..n-1
    text: str  # detokenized text so far (stop strings removed)
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None  # one entry per token when asked for
    finish_reason: str | None  # None while running; "stop", "length", "repetition" or "abort" when done
    cumulative_logprob: float = 0.0
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    # What this output adds to the previous output of the same completion (streaming reads these):
    new_text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprob] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


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

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served (vLLM's name for metrics.num_cached_prompt_tokens)."""
        return self.metrics.num_cached_prompt_tokens
