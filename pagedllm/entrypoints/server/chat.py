"""POST /v1/chat/completions: messages through the model's chat template, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pagedllm.engine.async_engine import AsyncEngine, RequestAborted
from pagedllm.engine.outputs import RequestOutput
from pagedllm.entrypoints.protocol import ChatCompletionRequest
from pagedllm.entrypoints.server import limits, sse
from pagedllm.entrypoints.server.deltas import ChoiceDelta, DeltaTracker, HeldTokens
from pagedllm.entrypoints.server.errors import from_abort, sse_error
from pagedllm.engine.token_text import TokenText
from pagedllm.entrypoints.server.logprobs import TokenIdText, chat_logprobs, token_first, vllm_prompt_logprobs
from pagedllm.entrypoints.server.options import ServerOptions, apply_server_defaults
from pagedllm.entrypoints.server.prompts import PromptProcessor
from pagedllm.entrypoints.server.request_body import parse_body
from pagedllm.entrypoints.server.submission import (Submission, check_capacity, check_model, submit,
                                                     until_disconnected)
from pagedllm.entrypoints.reasoning import opens_in_reasoning
from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from pagedllm.entrypoints.server.chat_text import ChatText, ChoiceStream
from pagedllm.sampling_params import SamplingParams

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Any:
    engine: AsyncEngine = request.app.state.engine
    check_capacity(engine)
    body = await parse_body(request, ChatCompletionRequest)
    check_model(engine, body.model)
    body.check_streaming()
    options: ServerOptions = request.app.state.options
    apply_server_defaults(body, options)
    parsers: ChatParsers = request.app.state.chat_parsers
    tools = body.tool_choice_for(parsers.tool_call_parser, parsers.auto_tool_choice)
    params = body.to_sampling_params(engine.sampling_defaults, tools)
    prompt, params, opened = await chat_prompt(request, body, params)
    chat_text = ChatText(tools, opened, body.include_reasoning, body.echoed_text(), request.app.state.think_ids)
    # what the model is fed, as text: the template's output as tokenized (and cut, with truncate_prompt_tokens)
    prompt_text = await request.app.state.prompts.decode(prompt) if body.return_prompt_text else None
    submission = await submit(engine, "chatcmpl", [prompt], params, body, request.headers)
    view = _View(body, submission, params.n, request.app.state.token_text, chat_text, prompt_text,
                 options.enable_prompt_tokens_details)
    if body.stream:
        return StreamingResponse(view.stream(), media_type="text/event-stream", headers=sse.HEADERS)
    finals = await until_disconnected(request, submission.collect(), submission)
    return view.response(finals[0])


async def chat_prompt(request: Request, body: ChatCompletionRequest,
                      params: SamplingParams) -> tuple[list[int], SamplingParams, bool | None]:
    """The chat's prompt ids; its sampling params, a constraint held after the reasoning where a reasoning parser
    is on; and whether the answer begins in reasoning (None: no reasoning parser)."""
    state = request.app.state
    prompt = await _prompt_ids(state.prompts, state.engine.max_model_len, body, params)
    parser = state.chat_parsers.reasoning_parser
    if parser is None:
        return prompt, params, None
    opened = opens_in_reasoning(parser, await state.prompts.decode(prompt[-8:]))  # does it leave <think> open?
    return prompt, _constrained_after_reasoning(params, opened), opened


async def _prompt_ids(processor: PromptProcessor, max_model_len: int, body: ChatCompletionRequest,
                      params: SamplingParams) -> list[int]:
    """The templated, tokenized messages (off the engine thread), checked against the context length."""
    limits.check_sampling(params, processor.vocab_size)
    ids = await processor.chat_prompt(body.template_messages(), body.template_options(), bool(body.add_special_tokens))
    ids = params.truncated_prompt(ids, max_model_len)
    limits.check_prompt_length(len(ids), "messages", max_model_len)
    # the request's own value only: the model's default (generation_config.json), like none, is shortened by the
    # engine to what the context leaves
    limits.check_completion_budget(len(ids), *body.asked_max_tokens(), max_model_len)
    return ids


def _constrained_after_reasoning(params: SamplingParams, opened: bool) -> SamplingParams:
    """A thinking model thinks first: its constraint (structured outputs, a forced tool call) holds after the
    reasoning block, as vLLM starts it where the reasoning ends."""
    if params.structured_outputs is None:
        return params
    after = "open" if opened else "optional"
    return replace(params, structured_outputs=replace(params.structured_outputs, after_reasoning=after))


class _View:
    """Shapes one chat call's engine outputs into the OpenAI response or chunks."""

    def __init__(self, body: ChatCompletionRequest, submission: Submission, n: int, text_of: TokenText,
                 chat_text: ChatText, prompt_text: str | None, cached_details: bool = False) -> None:
        self.body, self.submission, self.n, self.text_of = body, submission, n, text_of
        self.prompt_text = prompt_text  # where return_prompt_text asked for it
        self.cached_details = cached_details  # usage's prompt_tokens_details (--enable-prompt-tokens-details)
        self.names = TokenIdText(text_of) if body.return_tokens_as_token_ids else text_of  # tokens in logprobs
        self.usage = sse.ChunkUsage(body.stream_options, submission.prompt_lengths)
        self.chat_text = chat_text
        self._streams: dict[int, ChoiceStream] = {}
        self._held: dict[int, HeldTokens] = {}

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.submission.id, "object": obj, "created": self.submission.created,
                "model": self.submission.engine.model_name, "system_fingerprint": None, "choices": choices}

    def _logprobs(self, entries: list | None) -> dict[str, Any] | None:
        if entries is None or not self.body.logprobs:
            return None
        return chat_logprobs(token_first(entries) if self.body.logprob_token_ids else entries, self.names)

    def response(self, final: RequestOutput) -> dict[str, Any]:
        choices = [{"index": c.index, **self.chat_text.message(c.text, c.finish_reason),
                    "logprobs": self._logprobs(c.logprobs), "stop_reason": c.stop_reason,
                    **self._token_ids(c.token_ids)} for c in sorted(final.outputs, key=lambda c: c.index)]
        response = {**self._envelope("chat.completion", choices), "usage": self._usage(final)}
        if self.body.prompt_logprobs is not None:
            response["prompt_logprobs"] = vllm_prompt_logprobs(final.prompt_logprobs or [], self.text_of)
        if self.body.return_token_ids:
            response["prompt_token_ids"] = final.prompt_token_ids
        if self.prompt_text is not None:
            response["prompt_text"] = self.prompt_text
        return response

    def _token_ids(self, token_ids: list[int]) -> dict[str, Any]:
        """A choice's (or a chunk's) token ids, where return_token_ids asked for them."""
        return {"token_ids": list(token_ids)} if self.body.return_token_ids else {}

    def _usage(self, final: RequestOutput) -> dict[str, Any]:
        cached = final.metrics.num_cached_prompt_tokens if self.cached_details else None
        usage = sse.usage(len(final.prompt_token_ids), sum(len(c.token_ids) for c in final.outputs), cached)
        details = self.chat_text.usage_details([c.token_ids for c in final.outputs])
        return usage if details is None else {**usage, "completion_tokens_details": details}

    def _chunk(self, choice: dict[str, Any], new_tokens: int = 0) -> str:
        chunk = self._envelope("chat.completion.chunk", [choice])
        return sse.event(self.usage.stamp(chunk, 0, choice["index"], new_tokens))

    def _delta_chunks(self, delta: ChoiceDelta) -> list[str]:
        """The chunks of a choice's new text: reasoning, content, tool calls, the finish. Tokens whose text is still
        held (a tool call, a tag not yet whole) go out (with their logprobs) in the next chunk sent."""
        held = self._held.setdefault(delta.index, HeldTokens())
        held.add(delta)
        stream = self._streams.setdefault(delta.index, ChoiceStream(self.chat_text))
        parts = stream.feed(delta.text, delta.finish_reason is not None)
        finish = stream.finish_reason(delta.finish_reason) if delta.finish_reason is not None else None
        chunks = [self._held_chunk(held, {"index": delta.index, "delta": part, "finish_reason": None})
                  for part in parts]
        if finish is not None:
            chunks.append(self._held_chunk(held, {"index": delta.index, "delta": {}, "finish_reason": finish,
                                                  "stop_reason": delta.stop_reason}))
        return chunks

    def _held_chunk(self, held: HeldTokens, choice: dict[str, Any]) -> str:
        """A chunk of `choice` that carries the held tokens (their logprobs and ids) out."""
        token_ids, logprobs = held.take()
        return self._chunk({**choice, "logprobs": self._logprobs(logprobs), **self._token_ids(token_ids)},
                           len(token_ids))

    def _role_chunk(self, index: int) -> str:
        """A choice's first chunk; the first of all carries the prompt's token ids and text, where asked for."""
        chunk = self._envelope("chat.completion.chunk", [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                          "logprobs": None, "finish_reason": None}])
        if self.body.return_token_ids:
            chunk["prompt_token_ids"] = self.submission.prompts[0] if index == 0 else None
        if self.prompt_text is not None and index == 0:
            chunk["prompt_text"] = self.prompt_text
        return sse.event(self.usage.stamp(chunk, 0, index))

    async def stream(self) -> AsyncIterator[str]:
        tracker = DeltaTracker(self.n, self.body.stream_interval)
        last: RequestOutput | None = None
        try:
            for index in range(self.n):
                yield self._role_chunk(index)
            for index in range(self.n if self.chat_text.echo else 0):
                yield self._chunk({"index": index, "delta": {"content": self.chat_text.echo}, "logprobs": None,
                                   "finish_reason": None})
            async for output in self.submission.outputs():
                for delta in tracker.deltas(0, output):
                    for chunk in self._delta_chunks(delta):
                        yield chunk
                last = output
            if self.usage.include:
                usage = sse.usage(0, 0) if last is None else self._usage(last)
                yield sse.event({**self._envelope("chat.completion.chunk", []), "usage": usage})
        except RequestAborted as exc:
            yield sse_error(from_abort(exc))
        finally:
            self.submission.abort_unfinished()
        yield sse.DONE
