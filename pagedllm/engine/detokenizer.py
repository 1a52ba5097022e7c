"""Incremental detokenization with stop strings, safe for streaming.

Text is decoded over a short sliding window of ids: `prefix_offset..read_offset`
is already-emitted context (a few prompt tokens at the start, so leading
spaces and merges decode as they would in the full sequence) and
`read_offset..end` holds the tokens not yet turned into text. The new text is
decode(window) minus decode(context); while it ends in U+FFFD (a UTF-8
character split across byte tokens) it is held back until later tokens
complete it, and dropped whole if none do (as vLLM drops it: a token that
brings a space and a character's first byte shows neither).

Stop strings are searched in the accumulated text. While streaming, any tail
that could still grow into a stop string is held back, so partial stop text
is never emitted; on a match the output ends before the stop string (or
after it with include_stop_str_in_output).
"""

from typing import Protocol

from pagedllm.sampling_params import SamplingParams

CONTEXT_TOKENS = 5  # prompt tokens decoded as context for the first output token
MAX_CHAR_BYTES = 4  # UTF-8: a character spelled as byte tokens takes at most four
REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    """Both transformers tokenizers and `tokenizers.Tokenizer` fit."""

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


PROBE_TEXT = "Hello , world . It 's 3 ! Don't ?  a\n\tb 😀 中文 ü"  # spaces before punctuation: what clean-ups change


def direct_decoder(tokenizer: Tokenizer) -> Tokenizer:
    """The `tokenizers.Tokenizer` under a transformers fast tokenizer, where it decodes the same text.

    An incremental decode calls decode twice per token; transformers' wrapper around the Rust decoder costs
    more than the decoding itself (4.7 against 1.9 us for 12 ids). The wrapper can change the text (space
    clean-up, a subclass's own decode), so the backend is used only without clean-up and when it decodes a
    probe (text with spaces before punctuation, special tokens, the first ids) the same, with and without
    skipping special tokens; else the tokenizer itself."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer
    special = list(getattr(tokenizer, "all_special_ids", []))[:8]
    probe = tokenizer.encode(PROBE_TEXT, add_special_tokens=False) + special + list(range(min(256, len(tokenizer))))
    for skip in (False, True):
        if backend.decode(probe, skip_special_tokens=skip) != tokenizer.decode(probe, skip_special_tokens=skip):
            return tokenizer
    return backend


class IncrementalDetokenizer:
    """Turns one completion's tokens into text deltas; one instance per completion."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        params: SamplingParams,
        prompt_ids: list[int],
        stop_token_ids: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        """stop_token_ids: ids that end the request (EOS, params.stop_token_ids); they add
        no text unless include_stop_str_in_output."""
        self.tokenizer = tokenizer
        self.params = params
        self.stop_token_ids = frozenset(stop_token_ids)
        self.ids: list[int] = _context(tokenizer, prompt_ids, params.skip_special_tokens)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self._decoded = ""  # all text decoded so far (stop strings not cut)
        self._emitted = 0  # length of the _decoded prefix handed out
        self._final: str | None = None  # set once a stop string matched or finish() ran
        self.stop_reason: str | None = None  # the stop string that matched
        self._max_stop = max((len(s) for s in params.stop), default=0)
        self._num_output = 0  # output tokens appended
        self._stop_after = 0  # a stop string must end past this much of _decoded (none before min_tokens)

    @property
    def text(self) -> str:
        """The output text so far: everything emitted (the whole output once finished)."""
        return self._final if self._final is not None else self._decoded[: self._emitted]

    @property
    def finished(self) -> bool:
        return self._final is not None

    def append(self, token_id: int) -> str:
        """Add one output token; return the text delta that is now safe to show."""
        if self._final is not None:
            return ""
        self._num_output += 1
        if token_id in self.stop_token_ids and not self.params.include_stop_str_in_output:
            return ""
        self.ids.append(token_id)
        self._decoded += self._decode_new()
        if self._num_output <= self.params.min_tokens:  # as vLLM: a stop string ends past the first min_tokens
            self._stop_after = len(self._decoded)
        return self._advance(final=False)

    def finish(self) -> str:
        """End of the completion: flush the text held back for stop strings and return it. The text of last
        tokens that leave a character incomplete is dropped, as vLLM drops it, not shown as U+FFFD."""
        if self._final is not None:
            return ""
        return self._advance(final=True)

    def _decode_new(self) -> str:
        skip = self.params.skip_special_tokens
        context = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        window = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=skip)
        if len(window) <= len(context) or window.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new yet, or a character still split across tokens
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return window[len(context) :]

    def _advance(self, final: bool) -> str:
        """Check stop strings, then emit up to the safe boundary."""
        cut = self._find_stop()
        if cut is not None:
            return self._end(cut)
        if final:
            return self._end(len(self._decoded))
        safe = len(self._decoded) - self._stop_prefix_len()
        delta = self._decoded[self._emitted : safe]
        self._emitted = max(self._emitted, safe)
        return delta

    def _end(self, cut: int) -> str:
        delta = self._decoded[self._emitted : cut]
        self._final = self._decoded[:cut]
        self._emitted = cut
        return delta

    def _find_stop(self) -> int | None:
        """Where the output ends if a stop string occurs in the new text: the one that completes first (the
        first listed of those that complete together), as appending tokens one character at a time would find."""
        start = max(0, self._emitted - self._max_stop)
        best: tuple[int, str] | None = None
        for stop in self.params.stop:
            i = self._decoded.find(stop, max(start, self._stop_after - len(stop) + 1))
            if i >= 0 and (best is None or i + len(stop) < best[0] + len(best[1])):
                best = (i, stop)
        if best is None:
            return None
        self.stop_reason = best[1]
        keep = len(best[1]) if self.params.include_stop_str_in_output else 0
        return best[0] + keep

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        tail = self._decoded[-self._max_stop :] if self._max_stop else ""
        for k in range(min(len(tail), self._max_stop - 1), 0, -1):
            if any(stop.startswith(tail[-k:]) for stop in self.params.stop):
                return k
        return 0


def _context(tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool) -> list[int]:
    """The prompt's last CONTEXT_TOKENS ids, reaching back to where a character starts: a character cut in two
    decodes as U+FFFD, and a byte-fallback decoder (SentencePiece vocabularies) turns the whole run of byte
    tokens it begins, the output's own included, into U+FFFD."""
    start = max(0, len(prompt_ids) - CONTEXT_TOKENS)
    for _ in range(MAX_CHAR_BYTES - 1):
        head = tokenizer.decode(prompt_ids[start:], skip_special_tokens=skip_special_tokens)
        if start == 0 or not head.startswith(REPLACEMENT_CHAR):
            break
        start -= 1
    return list(prompt_ids[start:])


def decode_after(tokenizer: Tokenizer, prompt_ids: list[int], ids: list[int], skip_special_tokens: bool) -> str:
    """The text of `ids` as it reads after the prompt, all at once (a SentencePiece word's leading space, which
    decoding the ids alone drops, included)."""
    context = _context(tokenizer, prompt_ids, skip_special_tokens)
    before = tokenizer.decode(context, skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(context + ids, skip_special_tokens=skip_special_tokens)[len(before) :]
