"""POST /v1/responses: OpenAI's Responses API over the chat path, whole or as its stream of typed events.

The answer is one message item (`output_text`), after a reasoning item where a reasoning parser finds one. A
stream sends vLLM's sequence of events: response.created and .in_progress; per item output_item.added,
content_part.added, the text's deltas, its .done events, output_item.done; then response.completed with the
whole response (its status "incomplete" where max_output_tokens cut the answer, as vLLM sends it).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pagedllm.engine.async_engine import AsyncEngine, RequestAborted
from pagedllm.engine.outputs import RequestOutput
from pagedllm.entrypoints.responses_protocol import ResponsesRequest
from pagedllm.entrypoints.server import sse
from pagedllm.entrypoints.server.chat import chat_prompt
from pagedllm.entrypoints.server.chat_text import ChatText, ChoiceStream
from pagedllm.entrypoints.server.deltas import DeltaTracker
from pagedllm.entrypoints.server.errors import from_abort
from pagedllm.entrypoints.server.request_body import parse_body
from pagedllm.entrypoints.server.submission import Submission, check_capacity, check_model, submit, until_disconnected
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

router = APIRouter()
STATUS = {"stop": "completed", "length": "incomplete", "abort": "cancelled"}  # by the answer's finish reason


@router.post("/v1/responses")
async def create_response(request: Request) -> Any:
    engine: AsyncEngine = request.app.state.engine
    check_capacity(engine)
    body = await parse_body(request, ResponsesRequest)
    check_model(engine, body.model)
    chat = body.to_chat()
    params = _sampling_params(chat.to_sampling_params, engine.sampling_defaults)
    prompt, params, opened = await chat_prompt(request, chat, params)
    chat_text = ChatText(None, opened, body.include_reasoning, "", request.app.state.think_ids)
    submission = await submit(engine, "resp", [prompt], params, None)
    view = _View(body, submission, params, chat_text)
    if body.stream:
        return StreamingResponse(view.stream(), media_type="text/event-stream", headers=sse.HEADERS)
    finals = await until_disconnected(request, submission.collect(), submission)
    return view.response(finals[0])


def _sampling_params(make: Any, defaults: dict[str, Any]) -> SamplingParams:
    """The chat's sampling params, an error naming the field as this API names it."""
    try:
        return make(defaults)
    except InvalidInputError as exc:
        field, _, rest = str(exc).partition(" ")
        named = "max_output_tokens" if field == "max_completion_tokens" else field
        raise InvalidInputError(f"{named} {rest}") from None


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _View:
    """Shapes one response's engine output into the Response object or its stream of events."""

    def __init__(self, body: ResponsesRequest, submission: Submission, params: SamplingParams,
                 chat_text: ChatText) -> None:
        self.body, self.submission, self.params, self.chat_text = body, submission, params, chat_text
        self.id = submission.id.replace("resp-", "resp_", 1)
        self.message_id, self.reasoning_id = _item_id("msg"), _item_id("rs")

    def in_progress(self) -> dict[str, Any]:
        """The Response object of an answer under way: no output, no usage yet."""
        return self._envelope("in_progress", [], None)

    def response(self, final: RequestOutput) -> dict[str, Any]:
        """The Response object of a finished answer."""
        (completion,) = final.outputs
        reasoning, content = self.chat_text.split(completion.text)
        output = [self.reasoning_item(reasoning)] if reasoning and self.chat_text.include_reasoning else []
        output.append(self.message_item(content or ""))
        return self._envelope(STATUS.get(completion.finish_reason or "", "completed"), output, self._usage(final))

    def _envelope(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        return {"id": self.id, "object": "response", "created_at": self.submission.created, "status": status,
                "background": False, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
                "metadata": body.metadata, "model": self.submission.engine.model_name, "output": output,
                "parallel_tool_calls": True, "previous_response_id": None, "reasoning": body.reasoning,
                "store": False, "temperature": self.params.temperature, "text": body.text_config(),
                "tool_choice": "none", "tools": [], "top_p": self.params.top_p, "truncation": "disabled",
                "usage": usage, "user": body.user}

    def _usage(self, final: RequestOutput) -> dict[str, Any]:
        output_ids = final.outputs[0].token_ids
        details = self.chat_text.usage_details([output_ids]) or {"reasoning_tokens": 0}
        prompt_tokens = len(final.prompt_token_ids)
        return {"input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": final.metrics.num_cached_prompt_tokens},
                "output_tokens": len(output_ids), "output_tokens_details": details,
                "total_tokens": prompt_tokens + len(output_ids)}

    def message_item(self, text: str | None, status: str = "completed") -> dict[str, Any]:
        content = [] if text is None else [_part("output_text", text)]
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def reasoning_item(self, text: str | None, status: str = "completed") -> dict[str, Any]:
        content = [] if text is None else [_part("reasoning_text", text)]
        return {"id": self.reasoning_id, "type": "reasoning", "summary": [], "content": content,
                "encrypted_content": None, "status": status}

    async def stream(self) -> AsyncIterator[str]:
        events = _Events(self)
        last: RequestOutput | None = None
        try:
            for name in ("response.created", "response.in_progress"):
                yield events.event(name, response=self.in_progress())
            tracker, text = DeltaTracker(1), ChoiceStream(self.chat_text)
            async for output in self.submission.outputs():
                for delta in tracker.deltas(0, output):
                    for part in text.feed(delta.text, delta.finish_reason is not None):
                        for event in events.part(part):
                            yield event
                last = output
            for event in events.finish():
                yield event
            if last is not None:
                yield events.event("response.completed", response=self.response(last))
        except RequestAborted as exc:  # OpenAI's error event
            yield events.event("error", code="request_aborted", message=from_abort(exc).message, param=None)
        finally:
            self.submission.abort_unfinished()


class _Events:
    """A response's stream events in order, each numbered; at most one item open at a time."""

    def __init__(self, view: _View) -> None:
        self.view = view
        self.number = 0
        self.kind: str | None = None  # the open item: "reasoning" or "message"
        self.text = ""  # the open item's text so far
        self.index = -1  # the open item's output_index
        self.sent_message = False

    def event(self, name: str, **fields: Any) -> str:
        payload = {"type": name, "sequence_number": self.number, **fields}
        self.number += 1
        return f"event: {name}\n{sse.event(payload)}"

    def part(self, part: dict[str, Any]) -> list[str]:
        """The events of one delta of the answer: {"reasoning": text} or {"content": text}."""
        kind = "reasoning" if "reasoning" in part else "message"
        events = [] if self.kind == kind else self.close() + self._open(kind)
        self.text += part.get("reasoning") or part.get("content") or ""
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        return events + [self.event(name, **self._at(), delta=part.get("reasoning") or part.get("content"))]

    def finish(self) -> list[str]:
        """The events that end the answer: the open item's, and an empty message item's where none was sent (the
        whole response always has one)."""
        events = self.close()
        return events if self.sent_message else events + self._open("message") + self.close()

    def close(self) -> list[str]:
        """The events that finish the open item, if any."""
        if self.kind is None:
            return []
        kind, text = self.kind, self.text
        done = "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
        item = self.view.reasoning_item(text) if kind == "reasoning" else self.view.message_item(text)
        events = [self.event(done, **self._at(), text=text),
                  self.event("response.content_part.done", **self._at(), part=item["content"][0]),
                  self.event("response.output_item.done", output_index=self.index, item=item)]
        self.kind, self.text = None, ""
        return events

    def _open(self, kind: str) -> list[str]:
        self.kind, self.index = kind, self.index + 1
        self.sent_message = self.sent_message or kind == "message"
        empty = self.view.reasoning_item(None, "in_progress") if kind == "reasoning" else \
            self.view.message_item(None, "in_progress")
        part = _part("reasoning_text" if kind == "reasoning" else "output_text", "")
        return [self.event("response.output_item.added", output_index=self.index, item=empty),
                self.event("response.content_part.added", **self._at(), part=part)]

    def _at(self) -> dict[str, Any]:
        item_id = self.view.reasoning_id if self.kind == "reasoning" else self.view.message_id
        return {"item_id": item_id, "output_index": self.index, "content_index": 0}


def _part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text, "annotations": []} if kind == "output_text" else {"type": kind, "text": text}
