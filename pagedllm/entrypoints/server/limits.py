"""The limits a request is held to before it reaches the engine: context length and token-id ranges."""

from __future__ import annotations

from collections.abc import Sequence

from pagedllm.entrypoints.server.errors import APIError
from pagedllm.sampling_params import SamplingParams


def check_token_ids(param: str, ids: Sequence[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise APIError(400, f"{param} must hold token ids in [0, {vocab_size}); got {bad[:3]}", param=param)


def check_sampling(params: SamplingParams, vocab_size: int) -> None:
    """Fields that name token ids or count them must stay within the vocabulary."""
    check_token_ids("stop_token_ids", params.stop_token_ids, vocab_size)
    check_token_ids("logit_bias", list(params.logit_bias or {}), vocab_size)
    check_token_ids("allowed_token_ids", params.allowed_token_ids or [], vocab_size)
    if params.top_k > vocab_size:
        raise APIError(400, f"top_k must be at most the vocabulary size ({vocab_size}), got {params.top_k}",
                       param="top_k")


def check_prompt_length(prompt_len: int, param: str, max_model_len: int) -> None:
    if prompt_len >= max_model_len:
        raise prompt_too_long(str(prompt_len), param, max_model_len)


def prompt_too_long(count: str, param: str, max_model_len: int) -> APIError:
    return APIError(400, f"This model's maximum context length is {max_model_len} tokens, but the prompt "
                         f"alone has {count}; shorten it so at least one token is left for the completion.",
                    param=param)


def check_completion_budget(prompt_len: int, max_tokens: int | None, param: str, max_model_len: int) -> None:
    """An explicit max_tokens must fit beside the prompt (None means: up to the context)."""
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens, but the request "
                            f"asks for {prompt_len + max_tokens}: {prompt_len} in the prompt and {max_tokens} "
                            f"for {param}. Lower {param} or shorten the prompt.", param=param)
