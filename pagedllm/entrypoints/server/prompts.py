"""Prompts tokenized and chat-templated in worker threads, each thread with its own tokenizer copy.

The engine thread receives only token ids, already checked, so a request that is slow to
tokenize delays nobody's next token. Hugging Face fast tokenizers release the GIL while they
encode, and are not safe to share between threads, hence the copies.

A text far longer than the context is refused after tokenizing only as much of it as it takes
to pass twice the context length, piece by piece: tokenizing a body-cap-sized text in one go (and
freeing its millions of tokens) holds the GIL long enough to delay every stream.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pagedllm.entrypoints.server import limits
from pagedllm.entrypoints.server.errors import APIError
from pagedllm.errors import InvalidInputError
from pagedllm.model.chat_template import check_template_kwargs, render_chat

T = TypeVar("T")
WORKERS = 2
PIECE_CHARS = 16384  # texts longer than this are counted piece by piece first
# Tokens a cut between two pieces can add to the pieces' count (a word split in two, a
# tokenizer's per-text prefix): what the count may overstate the whole text's by, per cut.
CUT_SLACK = 4
# A cut inside a special token's text (no whitespace to cut at) can add more: a text is refused on its pieces'
# count only once that is this many times the context; a shorter one is tokenized whole and counted exactly.
FAR_PAST = 2


class PromptProcessor:
    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int, workers: int = WORKERS,
                 chat_template: str | None = None, trust_request_chat_template: bool = False,
                 default_template_kwargs: dict[str, Any] | None = None) -> None:
        # One copy per worker thread, made now: a copy takes tens of milliseconds, mostly holding the GIL.
        self._spares = [copy.deepcopy(tokenizer) for _ in range(workers)]
        self.chat_template = chat_template  # the server's --chat-template, in place of the model's
        self.trust_request_chat_template = trust_request_chat_template  # a request may bring its own
        # the server's --default-chat-template-kwargs, under each request's own
        self.default_template_kwargs = dict(default_template_kwargs or {})
        check_template_kwargs(tokenizer, self.default_template_kwargs, "--default-chat-template-kwargs")
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pagedllm-tokenize")
        self.vocab_size, self.max_model_len = vocab_size, max_model_len

    async def completion_prompts(self, prompts: list[str | list[int]], add_special_tokens: bool = True
                                 ) -> list[list[int]]:
        """Each prompt's token ids: text is tokenized (with the tokenizer's BOS/EOS unless add_special_tokens is
        false), given ids are checked against the vocabulary."""
        return await self._run(lambda: [self._prompt_ids(p, add_special_tokens) for p in prompts])

    async def chat_prompt(self, messages: list[dict[str, Any]], options: dict[str, Any],
                          add_special_tokens: bool = False) -> list[int]:
        """The messages through the model's chat template (render_chat's options; their `chat_template`, the
        request's own, where the server trusts requests with one), as token ids (the template writes the special
        tokens: the tokenizer adds its own only where add_special_tokens asks)."""
        options = dict(options)
        options["template_kwargs"] = {**self.default_template_kwargs, **(options.get("template_kwargs") or {})}
        own = options.pop("chat_template", None)
        if own is not None and not self.trust_request_chat_template:
            raise InvalidInputError("chat_template is passed with the request, but the server was not started with "
                                    "--trust-request-chat-template: refused (a template is code)")

        def render() -> list[int]:
            template = self.chat_template if own is None else own
            text = render_chat(self._tokenizer(), messages, chat_template=template, **options,
                               requested=own is not None)
            return self._encode(text, "messages", add_special_tokens)

        return await self._run(render)

    async def decode(self, ids: list[int]) -> str:
        """Token ids back to text (checked against the vocabulary)."""
        limits.check_token_ids("tokens", ids, self.vocab_size)
        return await self._run(lambda: self._tokenizer().decode(ids))

    async def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's vocabulary piece (as the tokenizer spells it, e.g. "Ġthe")."""
        return await self._run(lambda: list(self._tokenizer().convert_ids_to_tokens(ids)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _prompt_ids(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt must not be empty", param="prompt")
            return self._encode(prompt, "prompt", add_special_tokens)
        limits.check_token_ids("prompt", prompt, self.vocab_size)
        return prompt

    def _encode(self, text: str, param: str, add_special_tokens: bool) -> list[int]:
        if len(text) > PIECE_CHARS:
            self._refuse_if_far_too_long(text, param)
        return list(self._tokenizer().encode(text, add_special_tokens=add_special_tokens))

    def _refuse_if_far_too_long(self, text: str, param: str) -> None:
        count = 0
        for cuts, piece in enumerate(_pieces(text, PIECE_CHARS)):
            count += self._count(piece)
            if count - CUT_SLACK * cuts >= FAR_PAST * self.max_model_len:
                raise limits.prompt_too_long(f"more than {self.max_model_len} tokens", param, self.max_model_len)

    def _count(self, piece: str) -> int:
        tokenizer = self._tokenizer()
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust encoding's length: no list of ids is built
            return len(backend.encode_batch([piece], add_special_tokens=False)[0])
        return len(tokenizer.encode(piece, add_special_tokens=False))

    def _tokenizer(self) -> Any:
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            with self._lock:  # the pool starts at most `workers` threads, one spare each
                tokenizer = self._local.tokenizer = self._spares.pop()
        return tokenizer


def _pieces(text: str, size: int) -> Iterator[str]:
    """`text` in pieces of about `size` characters, cut before whitespace where there is some."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            space = max(text.rfind(" ", start + size // 2, end), text.rfind("\n", start + size // 2, end))
            end = space if space > start else end
        yield text[start:end]
        start = end
