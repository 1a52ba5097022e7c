"""Token id -> its text, as logprobs show each token (the server's OpenAI shapes, the offline API's
Logprob.decoded_token)."""

import functools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from pagedllm.engine.detokenizer import MAX_CHAR_BYTES, REPLACEMENT_CHAR

SPACE_MARKER = "\u2581"  # SentencePiece's "▁": a word's leading space in its vocabulary pieces


class TokenText:
    """Token id -> its text, with a small cache (the same ids recur across top-k lists)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._decode(token_id)
            if len(self._cache) < 65536:
                self._cache[token_id] = text
        return text

    def in_context(self, context: Sequence[int]) -> Callable[[int], str]:
        """Token id -> its text where it follows `context` (the tokens before it), as vLLM's decoded_token reads:
        a token that leaves a character unfinished reads "", and the token that finishes it reads the whole
        character, so that the texts of a completion's tokens join into its text."""
        # a character spans at most MAX_CHAR_BYTES tokens
        return functools.partial(self._after, tuple(context[-MAX_CHAR_BYTES:]))

    def _after(self, context: tuple[int, ...], token_id: int) -> str:
        text = self(token_id)
        if not text.endswith(REPLACEMENT_CHAR):
            return text
        for start in range(len(context) - 1, -1, -1):  # the shortest context that finishes the character
            window = list(context[start:])
            joined = self._tokenizer.decode(window + [token_id])
            if joined.endswith(REPLACEMENT_CHAR):
                continue
            # the window's last tokens that left the character unfinished read "": their bytes are shown here
            shown = len(window)
            while shown and self(window[shown - 1]).endswith(REPLACEMENT_CHAR):
                shown -= 1
            before = self._tokenizer.decode(window[:shown]) if shown else ""
            return joined[len(os.path.commonprefix([before, joined])) :]
        return ""

    def _decode(self, token_id: int) -> str:
        """The token decoded alone, with the leading spaces a SentencePiece decoder strips from a text's start
        given back (a word's piece "▁the" reads " the" inside a text, as vLLM shows it too)."""
        text = self._tokenizer.decode([token_id])
        piece = self._tokenizer.convert_ids_to_tokens(token_id) or ""
        markers = len(piece) - len(piece.lstrip(SPACE_MARKER))
        missing = markers - (len(text) - len(text.lstrip(" ")))
        return " " * missing + text if missing > 0 else text

    def bytes_of(self, token_id: int) -> list[int]:
        """The token's own bytes (OpenAI's `bytes`, for joining characters split across tokens): its text's where
        it reads whole, else its vocabulary piece's (a <0xNN> byte token, or a byte-level BPE piece's)."""
        text = self(token_id)
        if REPLACEMENT_CHAR not in text:
            return list(text.encode("utf-8"))
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if match := re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece or ""):
            return [int(match.group(1), 16)]
        decoder = _byte_level_decoder()
        if piece and all(char in decoder for char in piece):
            return [decoder[char] for char in piece]
        return list(text.encode("utf-8"))


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet -> the byte each character stands for (printable bytes stand for
    themselves, the others for the characters from U+0100 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}
