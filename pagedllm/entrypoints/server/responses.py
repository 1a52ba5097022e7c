"""POST /v1/responses: OpenAI's Responses API over the chat path, whole or as its stream of typed events.

The answer's items, in order: a reasoning item where a reasoning parser finds reasoning, a message item
(`output_text`) where there is text or no call, and a function_call item per tool call. A stream sends vLLM's
sequence of events: response.created and .in_progress; per item output_item.added, for text content_part.added,
the deltas (a call's arguments as function_call_arguments deltas) and the .done events, output_item.done; then
response.completed with the items as streamed (its status "incomplete" where max_output_tokens cut the answer, as
vLLM sends it).

Where the server keeps responses (--responses-store-size, response_store.py), a response is stored unless the body
says `"store": false`; `previous_response_id` then continues a stored one's conversation, GET /v1/responses/{id}
shows one, and `"background": true` answers at once with a queued response that runs on, until done or cancelled
(POST /v1/responses/{id}/cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pagedllm.engine.async_engine import AsyncEngine, RequestAborted
from pagedllm.engine.outputs import RequestOutput, TokenLogprob
from pagedllm.engine.token_text import TokenText
from pagedllm.entrypoints.responses_protocol import ResponsesRequest
from pagedllm.entrypoints.server import sse
from pagedllm.entrypoints.server.chat import chat_prompt
from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from pagedllm.entrypoints.server.chat_text import ChatText, ChoiceStream
from pagedllm.entrypoints.server.deltas import DeltaTracker, HeldTokens
from pagedllm.entrypoints.server.errors import APIError, from_abort
from pagedllm.entrypoints.server.logprobs import chat_logprob_entries, delta_logprob_entries
from pagedllm.entrypoints.server.request_body import parse_body
from pagedllm.entrypoints.server.response_store import ResponseStore, StoredResponse, not_found
from pagedllm.entrypoints.server.submission import Submission, check_capacity, check_model, submit, until_disconnected
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

router = APIRouter()
STATUS = {"stop": "completed", "length": "incomplete", "abort": "cancelled"}  # by the answer's finish reason
PART = {"reasoning": "reasoning_text", "message": "output_text"}  # a text item's one part, and its events' names


@router.post("/v1/responses")
async def create_response(request: Request) -> Any:
    engine: AsyncEngine = request.app.state.engine
    check_capacity(engine)
    body = await parse_body(request, ResponsesRequest)
    check_model(engine, body.model)
    store: ResponseStore | None = request.app.state.response_store
    history = _history(store, body)
    chat = body.to_chat(history)
    kept = _kept(store, body)
    parsers: ChatParsers = request.app.state.chat_parsers
    tools = chat.tool_choice_for(parsers.tool_call_parser, parsers.auto_tool_choice)
    params = chat.to_sampling_params(engine.sampling_defaults, tools)
    prompt, params, opened = await chat_prompt(request, chat, params)
    chat_text = ChatText(tools, opened, body.include_reasoning, "", request.app.state.think_ids)
    submission = await submit(engine, "resp", [prompt], params, chat, request.headers)
    view = _View(body, submission, params, chat_text, store if kept else None, body.chat_conversation(history),
                 request.app.state.token_text)
    if body.background:
        return view.start_in_background()
    if body.stream:
        return StreamingResponse(view.stream(), media_type="text/event-stream", headers=sse.HEADERS)
    finals = await until_disconnected(request, submission.collect(), submission)
    return view.keep(view.response(finals[0]))


@router.get("/v1/responses/{response_id}")
async def retrieve_response(request: Request, response_id: str) -> Any:
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise APIError(400, "a stored response is not streamed again here: GET it without stream", param="stream")
    return _stored(request, response_id).response


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> Any:
    stored = _stored(request, response_id)
    if not stored.running:
        raise APIError(400, f"only a background response still running can be cancelled; this one is "
                            f"{stored.response['status']}", param="response_id")
    stored.response = {**stored.response, "status": "cancelled"}
    task, stored.task = stored.task, None
    if task is not None:
        task.cancel()  # its engine request is aborted as the task ends
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return stored.response


def _stored(request: Request, response_id: str) -> StoredResponse:
    store: ResponseStore | None = request.app.state.response_store
    if store is None:  # nothing is kept: no id is known (vLLM answers the same with its store off)
        raise not_found(response_id)
    return store.get(response_id)


def _history(store: ResponseStore | None, body: ResponsesRequest) -> list[dict[str, Any]]:
    """The conversation of the stored response the body continues (none without previous_response_id)."""
    if body.previous_response_id is None:
        return []
    if store is None:
        raise InvalidInputError("previous_response_id needs stored responses: this server keeps none (start it "
                                "with --responses-store-size N), so send the whole conversation as input")
    previous = store.get(body.previous_response_id, param="previous_response_id")
    if previous.running:
        raise APIError(400, f"previous response {body.previous_response_id} is still {previous.response['status']}",
                       param="previous_response_id")
    return previous.conversation


def _kept(store: ResponseStore | None, body: ResponsesRequest) -> bool:
    """Whether this response is stored; a 400 for a background one that could not be."""
    if body.background:
        if store is None:
            raise InvalidInputError("background needs stored responses, where its result is fetched: start the "
                                    "server with --responses-store-size N")
        if body.store is False:
            raise InvalidInputError("background needs store: a background response is seen only through "
                                    "GET /v1/responses/{id}")
        if body.stream:
            raise InvalidInputError("background responses are not streamed here: poll GET /v1/responses/{id}")
    return store is not None and body.store is not False


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _View:
    """Shapes one response's engine output into the Response object or its stream of events."""

    def __init__(self, body: ResponsesRequest, submission: Submission, params: SamplingParams,
                 chat_text: ChatText, store: ResponseStore | None = None,
                 conversation: list[dict[str, Any]] = (), text_of: TokenText | None = None) -> None:
        self.body, self.submission, self.params, self.chat_text = body, submission, params, chat_text
        self.store, self.conversation = store, list(conversation)  # store: where this response is kept, if it is
        # where include asked for logprobs, how tokens are named in them (else None: none given). Where
        # include_reasoning leaves the reasoning out, its tokens' logprobs would show it: none are given then either
        # (vLLM's null)
        hidden = chat_text.reasoning_opened is not None and not chat_text.include_reasoning
        self.text_of = text_of if body.includes_logprobs and not hidden else None
        self.id = submission.id.replace("resp-", "resp_", 1)
        self.message_id, self.reasoning_id = _item_id("msg"), _item_id("rs")

    def in_progress(self, status: str = "in_progress") -> dict[str, Any]:
        """The Response object of an answer under way (or queued): no output, no usage yet."""
        return self._envelope(status, [], None)

    def keep(self, response: dict[str, Any]) -> dict[str, Any]:
        """A finished response, stored (where it is kept) with its conversation and answer."""
        if self.store is not None:
            self.store.put(self.id, StoredResponse(response, self.conversation + answer_messages(response["output"])))
        return response

    def start_in_background(self) -> dict[str, Any]:
        """The queued response, stored, its answer run on by a task that stores it when done."""
        queued = self.in_progress("queued")
        stored = StoredResponse(queued, self.conversation)
        self.store.put(self.id, stored)
        stored.task = asyncio.create_task(self._run_in_background(stored))
        return queued

    async def _run_in_background(self, stored: StoredResponse) -> None:
        stored.response = self.in_progress()
        try:
            finals = await self.submission.collect()
        except RequestAborted as exc:  # the engine stopped or failed
            stored.response = {**self._envelope("failed", [], None),
                               "error": {"code": "request_aborted", "message": from_abort(exc).message}}
        else:
            self.keep(self.response(finals[0]))
        finally:
            self.submission.abort_unfinished()  # where the task was cancelled
            stored.task = None

    def response(self, final: RequestOutput) -> dict[str, Any]:
        """The Response object of a finished answer."""
        (completion,) = final.outputs
        message = self.chat_text.message(completion.text, completion.finish_reason)["message"]
        calls = message.get("tool_calls", [])
        output = [self.reasoning_item(message["reasoning"])] if message.get("reasoning") else []
        if message["content"] or not calls:
            output.append(self.message_item(message["content"] or "", logprobs=completion.logprobs or []))
        output += [function_call_item(_item_id("fc"), call["id"], call["function"]["name"],
                                      call["function"]["arguments"]) for call in calls]
        return self.finished(final, output)

    def finished(self, final: RequestOutput, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The Response object of an answer that ended with `final`, made of these items."""
        status = STATUS.get(final.outputs[0].finish_reason or "", "completed")
        return self._envelope(status, output, self._usage(final))

    def _envelope(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        return {"id": self.id, "object": "response", "created_at": self.submission.created, "status": status,
                "background": bool(body.background), "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
                "max_tool_calls": body.max_tool_calls,
                "metadata": body.metadata, "model": self.submission.engine.model_name, "output": output,
                "parallel_tool_calls": body.parallel_tool_calls is not False,
                "previous_response_id": body.previous_response_id, "reasoning": body.reasoning,
                "store": self.store is not None, "temperature": self.params.temperature,
                "text": body.text_config(), "tool_choice": body.tool_choice_shown, "tools": body.tools or [],
                "top_p": self.params.top_p, "truncation": "disabled", "usage": usage, "user": body.user}

    def _usage(self, final: RequestOutput) -> dict[str, Any]:
        output_ids = final.outputs[0].token_ids
        details = self.chat_text.usage_details([output_ids]) or {"reasoning_tokens": 0}
        prompt_tokens = len(final.prompt_token_ids)
        return {"input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": final.metrics.num_cached_prompt_tokens},
                "output_tokens": len(output_ids), "output_tokens_details": details,
                "total_tokens": prompt_tokens + len(output_ids)}

    def message_item(self, text: str | None, status: str = "completed",
                     logprobs: list[TokenLogprob] = ()) -> dict[str, Any]:
        """The message item; its output_text part carries `logprobs` where include asked for them: those of every
        token of the answer as the whole response gives them (vLLM's), of its text's tokens as a stream gives them."""
        content = [] if text is None else [{**_part("output_text", text), "logprobs": self.part_logprobs(logprobs)}]
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def part_logprobs(self, entries: list[TokenLogprob]) -> list[dict[str, Any]] | None:
        """An output_text part's logprobs: null where none are given."""
        if self.text_of is None:
            return None
        return chat_logprob_entries(entries, self.text_of)

    def event_logprobs(self, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
        """An output_text event's logprobs (OpenAI's shape there: no bytes)."""
        if self.text_of is None:
            return []
        return delta_logprob_entries(entries, self.text_of)

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
            tracker, text, held = DeltaTracker(1), ChoiceStream(self.chat_text), HeldTokens()
            async for output in self.submission.outputs():
                for delta in tracker.deltas(0, output):
                    held.add(delta)
                    for part in text.feed(delta.text, delta.finish_reason is not None):
                        for event in events.part(part, held.take()[1] or []):  # the first part takes the held tokens
                            yield event
                last = output
            for event in events.finish(held.take()[1] or []):
                yield event
            if last is not None:
                yield events.event("response.completed", response=self.keep(self.finished(last, events.items)))
        except RequestAborted as exc:  # OpenAI's error event
            yield events.event("error", code="request_aborted", message=from_abort(exc).message, param=None)
        finally:
            self.submission.abort_unfinished()


class _Events:
    """A response's stream events in order, each numbered; at most one item open at a time, the finished ones kept
    (`items`) for response.completed."""

    def __init__(self, view: _View) -> None:
        self.view = view
        self.text_item = {"reasoning": view.reasoning_item, "message": view.message_item}
        self.number = 0
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.text = ""  # its text (a call's arguments) so far
        self.logprobs: list[TokenLogprob] = []  # its text's tokens' logprobs so far (a message's)

    def event(self, name: str, **fields: Any) -> str:
        payload = {"type": name, "sequence_number": self.number, **fields}
        self.number += 1
        return f"event: {name}\n{sse.event(payload)}"

    def part(self, part: dict[str, Any], logprobs: list[TokenLogprob]) -> list[str]:
        """The events of one delta of the answer: {"reasoning": text}, {"content": text} or {"tool_calls": [...]};
        `logprobs`: its tokens' (a message's text carries them, reasoning and calls not)."""
        if "tool_calls" in part:
            return [event for call in part["tool_calls"] for event in self._call(call)]
        kind, text = ("reasoning", part["reasoning"]) if "reasoning" in part else ("message", part["content"])
        events = [] if self.open is not None and self.open["type"] == kind else self.close() + self._open_text(kind)
        self.text += text
        if kind == "reasoning":
            return events + [self.event("response.reasoning_text.delta", **self._at(), content_index=0, delta=text)]
        self.logprobs += logprobs
        return events + [self.event("response.output_text.delta", **self._at(), content_index=0, delta=text,
                                    logprobs=self.view.event_logprobs(logprobs))]

    def finish(self, logprobs: list[TokenLogprob]) -> list[str]:
        """The events that end the answer: the open item's, and an empty message item's where neither text nor a
        call was sent (the whole response has one then). `logprobs`: of the last tokens, whose text never came (an
        end-of-text token), kept with an open message's."""
        if self.open is not None and self.open["type"] == "message":
            self.logprobs += logprobs
        events = self.close()
        if any(item["type"] in ("message", "function_call") for item in self.items):
            return events
        return events + self._open_text("message") + self.close()

    def close(self) -> list[str]:
        """The events that finish the open item, if any."""
        item, text, logprobs = self.open, self.text, self.logprobs
        if item is None:
            return []
        self.open, self.text, self.logprobs = None, "", []
        if item["type"] == "function_call":
            done = {**item, "arguments": text, "status": "completed"}
            events = [self.event("response.function_call_arguments.done", **self._at(item), arguments=text)]
        else:
            message = item["type"] == "message"
            done = self.view.message_item(text, logprobs=logprobs) if message else self.view.reasoning_item(text)
            shown = {"logprobs": self.view.event_logprobs(logprobs)} if message else {}
            events = [self.event(f"response.{PART[item['type']]}.done", **self._at(item), content_index=0, text=text,
                                 **shown),
                      self.event("response.content_part.done", **self._at(item), content_index=0,
                                 part=done["content"][0])]
        self.items.append(done)
        return events + [self.event("response.output_item.done", output_index=len(self.items) - 1, item=done)]

    def _open_text(self, kind: str) -> list[str]:
        self.open = self.text_item[kind](None, "in_progress")
        part = {**_part(PART[kind], ""), **({"logprobs": []} if kind == "message" else {})}
        return [self.event("response.output_item.added", output_index=len(self.items), item=self.open),
                self.event("response.content_part.added", **self._at(), content_index=0, part=part)]

    def _call(self, delta: dict[str, Any]) -> list[str]:
        """A tool_calls entry: a new call (it has its id) opens a function_call item; arguments go out as deltas."""
        events = []
        if "id" in delta:
            events = self.close()
            self.open = function_call_item(_item_id("fc"), delta["id"], delta["function"]["name"], "", "in_progress")
            events.append(self.event("response.output_item.added", output_index=len(self.items), item=self.open))
        arguments = delta["function"].get("arguments") or ""
        if arguments:
            self.text += arguments
            events.append(self.event("response.function_call_arguments.delta", **self._at(), delta=arguments))
        return events

    def _at(self, item: dict[str, Any] | None = None) -> dict[str, Any]:
        """Where the events of the open item (or of `item`, as it closes) point."""
        return {"item_id": (item or self.open)["id"], "output_index": len(self.items)}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def answer_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat message a later turn sees: its text and its function calls (its
    reasoning left out, as vLLM leaves it out)."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    if not calls:
        return [{"role": "assistant", "content": text}]
    return [{"role": "assistant", "content": text or None, "tool_calls": calls}]


def _part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text, "annotations": []} if kind == "output_text" else {"type": kind, "text": text}
