"""POST /tokenize and /detokenize, as vLLM's server answers them: the ids a prompt or a chat becomes, and back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.entrypoints.protocol import DetokenizeRequest, TokenizeRequest
from pagedllm.entrypoints.server.prompts import PromptProcessor
from pagedllm.entrypoints.server.request_body import parse_body
from pagedllm.entrypoints.server.submission import check_model

router = APIRouter()


@router.post("/tokenize")
async def tokenize(request: Request) -> dict[str, Any]:
    engine: AsyncEngine = request.app.state.engine
    body = await parse_body(request, TokenizeRequest)
    check_model(engine, body.model)
    body.check_input()
    processor: PromptProcessor = request.app.state.prompts
    if body.messages is not None:
        ids = await processor.chat_prompt(body.template_messages(), body.template_options(),
                                          bool(body.add_special_tokens))
    else:
        (ids,) = await processor.completion_prompts([body.prompt], add_special_tokens=body.add_special_tokens
                                                    is not False)  # fmt: skip
    strings = await processor.token_strings(ids) if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids, "token_strs": strings}


@router.post("/detokenize")
async def detokenize(request: Request) -> dict[str, Any]:
    engine: AsyncEngine = request.app.state.engine
    body = await parse_body(request, DetokenizeRequest)
    check_model(engine, body.model)
    return {"prompt": await request.app.state.prompts.decode(body.tokens)}


info_router = APIRouter()  # included only with --enable-tokenizer-info-endpoint, as in vLLM (it shows the template)


@info_router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict[str, Any]:
    """vLLM's: the tokenizer's configuration (its init arguments, file paths left out), its class, the chat template."""
    tokenizer = request.app.state.engine.tokenizer
    config = {key: _plain(value) for key, value in (getattr(tokenizer, "init_kwargs", None) or {}).items()
              if key not in ("vocab_file", "merges_file")}
    config["tokenizer_class"] = type(tokenizer).__name__
    template = request.app.state.prompts.chat_template or getattr(tokenizer, "chat_template", None)
    if template:
        config["chat_template"] = template
    return config


def _plain(value: Any) -> Any:
    """A tokenizer config value as JSON: an added token as its text, containers value by value, other objects as
    text."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
