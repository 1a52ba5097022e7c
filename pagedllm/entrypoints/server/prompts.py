"""Prompts tokenized and chat-templated in worker threads, each thread with its own tokenizer copy.

The engine thread receives only token ids, already checked, so a request that is slow to
tokenize (a prompt near the body cap) delays nobody's next token. Hugging Face fast tokenizers
release the GIL while they encode, and are not safe to share between threads, hence the copies.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pagedllm.entrypoints.server import limits
from pagedllm.entrypoints.server.errors import APIError

logger = logging.getLogger(__name__)
T = TypeVar("T")
WORKERS = 2


class PromptProcessor:
    def __init__(self, tokenizer: Any, vocab_size: int, workers: int = WORKERS) -> None:
        self._pristine = copy.deepcopy(tokenizer)  # only ever copied, under the lock
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pagedllm-tokenize")
        self.vocab_size = vocab_size

    async def completion_prompts(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """Each prompt's token ids: text is tokenized, given ids are checked against the vocabulary."""
        return await self._run(lambda: [self._prompt_ids(p) for p in prompts])

    async def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The messages through the model's chat template, with the generation prompt, as token ids."""
        return await self._run(lambda: _apply_template(self._tokenizer(), messages))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt must not be empty", param="prompt")
            return list(self._tokenizer().encode(prompt))
        limits.check_token_ids("prompt", prompt, self.vocab_size)
        return prompt

    def _tokenizer(self) -> Any:
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            with self._lock:
                tokenizer = self._local.tokenizer = copy.deepcopy(self._pristine)
        return tokenizer


def _apply_template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    from jinja2 import TemplateError

    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except TemplateError as exc:  # the template's own complaint (e.g. roles out of order) says what is wrong
        raise APIError(400, f"the model's chat template refused these messages: {exc}", param="messages") from None
    except Exception as exc:
        logger.debug("chat template failed", exc_info=exc)
        raise APIError(400, "the model's chat template could not render these messages", param="messages") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
