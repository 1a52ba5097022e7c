"""SamplingParams: how one request picks its tokens and when it stops (vLLM / OpenAI defaults)."""

import math
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from pagedllm.checks import is_int
from pagedllm.errors import InvalidInputError
from pagedllm.repetition_detection import RepetitionDetectionParams
from pagedllm.structured_outputs import StructuredOutputsParams

MAX_LOGPROBS = 20
MAX_LOGPROB_TOKEN_IDS = 128  # as vLLM bounds logprob_token_ids
MAX_LOGIT_BIAS = 100  # as OpenAI bounds it
MAX_BAD_WORDS = 128  # as vLLM bounds their token sequences (engine/bad_words.py): each is checked every step
# Temperature and repetition penalty divide float32 logits: past these bounds (a temperature of 0 apart) the
# quotient overflows or underflows float32 and sampling turns to NaN.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-6, 1e6
MAX_TOP_K = 2**31 - 1  # larger is "every token" anyway; the sampler keeps top_k in 64-bit tensors
EarlyStopping = bool | Literal["never"]


def _fail(name: str, rule: str, value: object) -> NoReturn:
    raise InvalidInputError(f"{name} {rule}, got {value!r}")


def _check(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        _fail(name, rule, value)


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None = up to the model's max length
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)  # a single str is accepted
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k alternatives per token, 0..20
    # vLLM's: instead of the top-k, these tokens' logprobs at every generated position (up to 128; `logprobs`, if set,
    # must count them); an empty list is none
    logprob_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None  # each prompt token's logprob and its top-k alternatives, 0..20
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling, -100..100
    allowed_token_ids: list[int] | None = None  # only these tokens may be sampled (logprobs stay the model's own)
    bad_words: list[str] | None = None  # words never sampled, as vLLM bans them (engine/bad_words.py)
    # a thinking model's reasoning blocks end after this many tokens (engine/thinking_budget.py); -1 or None: no limit
    thinking_token_budget: int | None = None
    # end a completion whose output repeats a pattern of tokens (finish_reason "repetition"), as vLLM's; a dict too
    repetition_detection: RepetitionDetectionParams | None = None
    truncate_prompt_tokens: int | None = None  # keep the prompt's last N tokens (-1: max_model_len), as vLLM does
    truncation_side: Literal["left", "right"] = "left"  # vLLM's: "right" keeps the prompt's first N tokens instead
    # what the output must be (a JSON schema, any JSON object, a regex, a choice, a grammar); a dict of its fields too
    structured_outputs: StructuredOutputsParams | None = None
    use_beam_search: bool = False
    beam_width: int | None = None  # defaults to n with beam search
    length_penalty: float = 1.0
    early_stopping: EarlyStopping = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True  # False: token ids only, no text (nor stop strings), as vLLM's

    def __post_init__(self) -> None:
        self._normalize()
        self._check_counts()
        self._check_sampling()
        self._check_penalties()
        self._check_logit_bias()
        self._check_allowed_tokens()
        self._check_bad_words()
        self._check_stops()
        self._check_beam()

    @property
    def num_logprobs(self) -> int | None:
        """Alternatives per generated token that come back (the top-k, or logprob_token_ids'), None for no logprobs."""
        return len(self.logprob_token_ids) if self.logprob_token_ids is not None else self.logprobs

    @property
    def greedy(self) -> bool:
        """Argmax decoding (temperature 0; beam search always has it)."""
        return self.temperature == 0.0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def has_logit_bias(self) -> bool:
        return bool(self.logit_bias)

    @property
    def restricts_tokens(self) -> bool:
        return self.allowed_token_ids is not None

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def stop_ids(self, eos_token_ids: set[int] | frozenset[int]) -> set[int]:
        """Token ids that end the request: stop_token_ids plus EOS unless ignore_eos."""
        ids = set(self.stop_token_ids)
        if not self.ignore_eos:
            ids |= set(eos_token_ids)
        return ids

    def min_tokens_banned(self, eos_token_ids: set[int] | frozenset[int]) -> set[int]:
        """Token ids no pick may take before min_tokens: stop_token_ids and EOS, with ignore_eos too (EOS then ends
        nothing, yet vLLM holds it back as well)."""
        return set(self.stop_token_ids) | set(eos_token_ids)

    def stop_reason(self, token: int, tokenizer_eos: int | None) -> int | None:
        """What a sequence stopped by `token` reports, as vLLM does: None for the tokenizer's end token, the id
        of any other (stop_token_ids, the model's other end tokens)."""
        return None if token == tokenizer_eos and not self.ignore_eos else token

    def truncated_prompt(self, token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt's ids cut to their last truncate_prompt_tokens, where set."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return token_ids
        keep = max_model_len if keep == -1 else keep
        _check(keep <= max_model_len, "truncate_prompt_tokens", f"must be -1 or in [1, max_model_len={max_model_len}]",
               self.truncate_prompt_tokens)
        return token_ids[-keep:] if self.truncation_side == "left" else token_ids[:keep]

    def _normalize(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            _check(isinstance(self.stop, (list, tuple)), "stop", "must be a string or a list of strings", self.stop)
            self.stop = list(self.stop)
        ids = self.stop_token_ids
        _check(ids is None or isinstance(ids, (list, tuple)), "stop_token_ids", "must be a list of integers", ids)
        self.stop_token_ids = [] if ids is None else list(ids)
        for name in ("ignore_eos", "use_beam_search", "skip_special_tokens", "include_stop_str_in_output",
                     "detokenize"):
            _check(isinstance(getattr(self, name), bool), name, "must be True or False", getattr(self, name))
        if self.top_k == -1:
            self.top_k = 0
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.from_value(self.structured_outputs)
        if self.repetition_detection is not None:
            self.repetition_detection = RepetitionDetectionParams.from_value(self.repetition_detection)
        if self.use_beam_search and self.beam_width is None:
            self.beam_width = self.n
        # Integer-valued floats from JSON (e.g. temperature=1) are fine; store floats.
        for name in ("temperature", "top_p", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty", "length_penalty"):
            value = getattr(self, name)
            _check(is_int(value) or isinstance(value, float),
                   name, "must be a number", value)
            setattr(self, name, float(value))

    def _check_counts(self) -> None:
        _check(is_int(self.n) and self.n >= 1, "n", "must be an integer >= 1", self.n)
        mt = self.max_tokens
        _check(mt is None or (is_int(mt) and mt >= 1), "max_tokens",
               "must be an integer >= 1 or None", mt)
        _check(is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens",
               "must be an integer >= 0", self.min_tokens)
        if mt is not None:
            _check(self.min_tokens <= mt, "min_tokens",
                   f"must be <= max_tokens ({mt})", self.min_tokens)
        _check(self.seed is None or is_int(self.seed), "seed",
               "must be an integer or None", self.seed)
        budget = self.thinking_token_budget
        _check(budget is None or (is_int(budget) and budget >= -1), "thinking_token_budget",
               "must be an integer >= 0, or -1 or None for no limit", budget)
        if budget == -1:
            self.thinking_token_budget = None
        keep = self.truncate_prompt_tokens
        _check(keep is None or (is_int(keep) and (keep == -1 or keep >= 1)), "truncate_prompt_tokens",
               "must be -1 or an integer >= 1", keep)
        _check(self.truncation_side in ("left", "right"), "truncation_side", "must be 'left' or 'right'",
               self.truncation_side)
        for name in ("logprobs", "prompt_logprobs"):
            lp = getattr(self, name)
            _check(lp is None or (is_int(lp) and 0 <= lp <= MAX_LOGPROBS), name,
                   f"must be an integer in [0, {MAX_LOGPROBS}] or None", lp)
        self._check_logprob_token_ids()

    def _check_logprob_token_ids(self) -> None:
        ids = self.logprob_token_ids
        if ids is None:
            return
        _check(isinstance(ids, (list, tuple)), "logprob_token_ids", "must be a list of token ids", ids)
        _check(len(ids) <= MAX_LOGPROB_TOKEN_IDS, "logprob_token_ids", f"may hold at most {MAX_LOGPROB_TOKEN_IDS} ids",
               len(ids))
        for t in ids:
            _check(is_int(t) and t >= 0, "logprob_token_ids", "must contain token ids (integers >= 0)", t)
        self.logprob_token_ids = list(dict.fromkeys(ids)) or None  # each once, in order; empty: none (vLLM's)
        if self.logprob_token_ids is not None and self.logprobs is not None:
            _check(self.logprobs == len(ids), "logprobs", f"must equal the {len(ids)} logprob_token_ids where both "
                   "are given (they replace the top-k)", self.logprobs)

    def _check_sampling(self) -> None:
        t = self.temperature
        _check(t == 0.0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE, "temperature",
               f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]", t)
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]", self.top_p)
        _check(is_int(self.top_k) and 0 <= self.top_k <= MAX_TOP_K, "top_k",
               f"must be an integer in [1, {MAX_TOP_K}], or 0 / -1 to disable", self.top_k)
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]", self.min_p)

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2.0 <= value <= 2.0, name, "must be in [-2, 2]", value)
        _check(MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY, "repetition_penalty",
               f"must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}]", self.repetition_penalty)

    def _check_allowed_tokens(self) -> None:
        allowed = self.allowed_token_ids
        if allowed is None:
            return
        _check(isinstance(allowed, (list, tuple)) and len(allowed) > 0, "allowed_token_ids",
               "must be a non-empty list of token ids", allowed)
        self.allowed_token_ids = list(allowed)
        for t in self.allowed_token_ids:
            _check(is_int(t) and t >= 0, "allowed_token_ids", "must contain integers >= 0", t)

    def _check_bad_words(self) -> None:
        words = self.bad_words
        if words is None:
            return
        _check(isinstance(words, (list, tuple)), "bad_words", "must be a list of strings", words)
        _check(len(words) <= MAX_BAD_WORDS, "bad_words", f"may hold at most {MAX_BAD_WORDS} words", len(words))
        for word in words:
            _check(isinstance(word, str) and word.strip() != "", "bad_words", "must contain words (not blank)", word)
        self.bad_words = list(dict.fromkeys(words))

    def _check_logit_bias(self) -> None:
        bias = self.logit_bias
        _check(bias is None or isinstance(bias, dict), "logit_bias", "must map token ids to numbers", bias)
        for token, value in (bias or {}).items():
            _check(is_int(token) and token >= 0, "logit_bias", "keys must be token ids (integers >= 0)", token)
            _check((is_int(value) or isinstance(value, float)) and -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS,
                   "logit_bias", f"values must be numbers in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]", value)

    def _check_stops(self) -> None:
        _check(self.detokenize or not self.stop, "stop", "(stop strings) needs detokenize=True", self.stop)
        for s in self.stop:
            _check(isinstance(s, str) and s != "", "stop", "must contain non-empty strings", s)
        for t in self.stop_token_ids:
            _check(is_int(t) and t >= 0, "stop_token_ids",
                   "must contain integers >= 0", t)

    def _check_beam(self) -> None:
        es = self.early_stopping
        _check(isinstance(es, bool) or es == "never", "early_stopping",
               "must be True, False or 'never'", es)
        if not self.use_beam_search:
            _check(self.beam_width is None, "beam_width",
                   "is only valid with use_beam_search=True", self.beam_width)
            _check(self.length_penalty == 1.0, "length_penalty",
                   "is only valid with use_beam_search=True", self.length_penalty)
            _check(es is False, "early_stopping",
                   "is only valid with use_beam_search=True", es)
            return
        _check(math.isfinite(self.length_penalty), "length_penalty", "must be a finite number", self.length_penalty)
        bw = self.beam_width
        _check(is_int(bw) and bw >= 1, "beam_width", "must be an integer >= 1", bw)
        _check(bw >= self.n, "beam_width", f"must be >= n ({self.n})", bw)
        _check(self.temperature == 0.0, "temperature",
               "must be 0 with use_beam_search (beam search is deterministic)",
               self.temperature)
        _check(self.top_p == 1.0 and self.top_k == 0 and self.min_p == 0.0, "top_p/top_k/min_p",
               "must be off (1.0 / 0 / 0.0) with use_beam_search",
               (self.top_p, self.top_k, self.min_p))
        # what the search does not apply is refused, not ignored
        _check(not self.stop, "stop", "(stop strings) is not supported with use_beam_search", self.stop)
        _check(self.logprobs is None, "logprobs", "is not supported with use_beam_search", self.logprobs)
        _check(self.logprob_token_ids is None, "logprob_token_ids", "is not supported with use_beam_search",
               self.logprob_token_ids)
        _check(not self.has_logit_bias, "logit_bias", "is not supported with use_beam_search", self.logit_bias)
        _check(not self.restricts_tokens, "allowed_token_ids", "is not supported with use_beam_search",
               self.allowed_token_ids)
        _check(not self.bad_words, "bad_words", "is not supported with use_beam_search", self.bad_words)
        _check(self.thinking_token_budget is None, "thinking_token_budget", "is not supported with use_beam_search",
               self.thinking_token_budget)
        _check(self.repetition_detection is None, "repetition_detection", "is not supported with use_beam_search",
               self.repetition_detection)
        _check(self.structured_outputs is None, "structured_outputs", "is not supported with use_beam_search",
               self.structured_outputs)
        _check(not self.has_penalties, "presence_penalty/frequency_penalty/repetition_penalty",
               "must be off (0 / 0 / 1.0) with use_beam_search",
               (self.presence_penalty, self.frequency_penalty, self.repetition_penalty))
