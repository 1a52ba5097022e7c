"""POST /v1/completions: text or token-id prompts, one or many, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pagedllm.engine.async_engine import AsyncEngine, RequestAborted
from pagedllm.engine.outputs import RequestOutput
from pagedllm.entrypoints.protocol import CompletionRequest
from pagedllm.entrypoints.server import limits, sse
from pagedllm.entrypoints.server.deltas import ChoiceDelta, DeltaTracker
from pagedllm.entrypoints.server.errors import from_abort, sse_error
from pagedllm.engine.token_text import TokenText
from pagedllm.entrypoints.server.logprobs import (TokenIdText, completion_logprobs, prompt_logprobs, token_first,
                                                   vllm_prompt_logprobs)
from pagedllm.entrypoints.server.options import ServerOptions, apply_server_defaults
from pagedllm.entrypoints.server.prompts import PromptProcessor
from pagedllm.entrypoints.server.request_body import parse_body
from pagedllm.entrypoints.server.submission import (Submission, check_capacity, check_model, submit,
                                                     until_disconnected)
from pagedllm.sampling_params import SamplingParams

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(request: Request) -> Any:
    engine: AsyncEngine = request.app.state.engine
    check_capacity(engine)
    body = await parse_body(request, CompletionRequest)
    check_model(engine, body.model)
    body.check_streaming()
    options: ServerOptions = request.app.state.options
    apply_server_defaults(body, options)
    params = body.to_sampling_params(engine.sampling_defaults)
    prompts = await _prompt_ids(request.app.state.prompts, engine.max_model_len, body, params)
    submission = await submit(engine, "cmpl", prompts, params, body, request.headers)
    view = _View(body, submission, params.n, request.app.state.token_text, options.enable_prompt_tokens_details)
    if body.stream:
        return StreamingResponse(view.stream(), media_type="text/event-stream", headers=sse.HEADERS)
    finals = await until_disconnected(request, submission.collect(), submission)
    return view.response(finals)


async def _prompt_ids(processor: PromptProcessor, max_model_len: int, body: CompletionRequest,
                      params: SamplingParams) -> list[list[int]]:
    """Every prompt tokenized off the engine thread, each checked against the context length."""
    limits.check_sampling(params, processor.vocab_size)
    special = body.add_special_tokens is not False  # the default for a text prompt: yes
    prompts = await processor.completion_prompts(body.prompts(), add_special_tokens=special)
    prompts = [params.truncated_prompt(ids, max_model_len) for ids in prompts]
    # max_tokens left out defaults to 16, which the engine shortens to what the context leaves.
    asked = body.max_tokens if "max_tokens" in body.model_fields_set else None
    for ids in prompts:
        limits.check_prompt_length(len(ids), "prompt", max_model_len)
        limits.check_completion_budget(len(ids), asked, "max_tokens", max_model_len)
    return prompts


class _View:
    """Shapes one completion call's engine outputs into the OpenAI response or chunks."""

    def __init__(self, body: CompletionRequest, submission: Submission, n: int, text_of: TokenText,
                 cached_details: bool = False) -> None:
        self.body, self.submission, self.n, self.text_of = body, submission, n, text_of
        self.cached_details = cached_details  # usage's prompt_tokens_details (--enable-prompt-tokens-details)
        self.names = TokenIdText(text_of) if body.return_tokens_as_token_ids else text_of  # tokens in logprobs
        self.engine = submission.engine
        self.prompts = body.prompts()
        self.usage = sse.ChunkUsage(body.stream_options, submission.prompt_lengths)

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.submission.id, "object": "text_completion", "created": self.submission.created,
                "model": self.engine.model_name, "system_fingerprint": None, "choices": choices}

    def _prompt_text(self, prompt_index: int, output: RequestOutput) -> str:
        prompt = self.prompts[prompt_index]
        if isinstance(prompt, str):
            return prompt
        return self.engine.tokenizer.decode(output.prompt_token_ids)

    def _logprobs(self, entries: list | None, offset: int) -> dict[str, Any] | None:
        if entries is None or self.body.logprobs is None:
            return None
        return completion_logprobs(token_first(entries) if self.body.logprob_token_ids else entries, self.names, offset)

    def _echo(self, prompt_index: int, output: RequestOutput) -> tuple[str, dict[str, Any] | None, int]:
        """The echoed prompt: its text, its logprobs (when asked for) and where its completions' text_offset
        starts, counted as the prompt's offsets count it (its tokens' texts, which differ from the prompt's
        where a token splits a character)."""
        text = self._prompt_text(prompt_index, output)
        if output.prompt_logprobs is None:
            return text, None, len(text)
        logprobs = prompt_logprobs(output.prompt_token_ids, output.prompt_logprobs, self.names)
        return text, logprobs, sum(map(len, logprobs["tokens"]))

    def _shown(self, output: RequestOutput) -> RequestOutput:
        """The output as the response shows it: scoring the prompt, without the one token run to get there."""
        if not self.body.scores_the_prompt:
            return output
        return replace(output, outputs=[
            replace(c, text="", token_ids=[], logprobs=None if c.logprobs is None else [], cumulative_logprob=0.0,
                    stop_reason=None, finish_reason=c.finish_reason and "length", new_text="", new_token_ids=[],
                    new_logprobs=None if c.new_logprobs is None else []) for c in output.outputs])

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        choices, shown = [], [self._shown(final) for final in finals]
        for prompt_index, output in enumerate(shown):
            prefix, echoed, offset = self._echo(prompt_index, output) if self.body.echo else ("", None, 0)
            for c in output.outputs:
                choices.append({"index": prompt_index * self.n + c.index, "text": prefix + c.text,
                                "logprobs": _after_echo(echoed, self._logprobs(c.logprobs, offset)),
                                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                                **self._extras(output, c.token_ids)})
        choices.sort(key=lambda choice: choice["index"])
        return {**self._envelope(choices), "usage": self._usage(shown)}

    def _usage(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        """Usage over each prompt's output as shown (and, where asked, the prompt tokens the prefix cache served)."""
        cached = sum(o.metrics.num_cached_prompt_tokens for o in outputs) if self.cached_details else None
        return sse.usage(sum(len(o.prompt_token_ids) for o in outputs),
                         sum(len(c.token_ids) for o in outputs for c in o.outputs), cached)

    def _extras(self, output: RequestOutput, token_ids: list[int]) -> dict[str, Any]:
        """A whole choice's fields of vLLM's extras, where the request asked for them."""
        extras: dict[str, Any] = {}
        if self.body.prompt_logprobs is not None:
            extras["prompt_logprobs"] = vllm_prompt_logprobs(output.prompt_logprobs or [], self.text_of)
        if self.body.return_token_ids:
            extras.update(prompt_token_ids=output.prompt_token_ids, token_ids=list(token_ids))
        return extras

    def _chunk(self, delta: ChoiceDelta, offset: int, prompt_ids: list[int] | None) -> dict[str, Any]:
        """prompt_ids: the prompt's token ids, in the choice's first chunk (with return_token_ids)."""
        choice = {"index": delta.index, "text": delta.text, "logprobs": self._logprobs(delta.logprobs, offset),
                  "finish_reason": delta.finish_reason, "stop_reason": delta.stop_reason}
        if self.body.return_token_ids:
            choice.update(prompt_token_ids=prompt_ids, token_ids=delta.token_ids)
        return self.usage.stamp(self._envelope([choice]), delta.index // self.n, delta.index, len(delta.token_ids))

    def _echo_chunks(self, prompt_index: int, text: str, logprobs: dict[str, Any] | None,
                     prompt_ids: list[int]) -> list[str]:
        ids = {"prompt_token_ids": prompt_ids, "token_ids": []} if self.body.return_token_ids else {}
        return [sse.event(self.usage.stamp(self._envelope([
            {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None, **ids}]), prompt_index, index))
            for index in range(prompt_index * self.n, (prompt_index + 1) * self.n)]

    async def stream(self) -> AsyncIterator[str]:
        tracker, echoed = DeltaTracker(self.n, self.body.stream_interval), {}  # prompt index -> its completions' text_offset base
        # choice index -> its next token's text_offset: counted by the tokens' texts, as the response counts them
        # (the text sent differs where a token splits a character)
        offsets: dict[int, int] = {}
        lasts: dict[int, RequestOutput] = {}  # each prompt's latest output: what usage counts
        started: set[int] = set()  # choices that sent a chunk
        try:
            async for output in self.submission.outputs():
                output = self._shown(output)
                prompt_index = self.submission.prompt_index(output)
                if self.body.echo and prompt_index not in echoed and _prompt_logprobs_done(output):
                    text, logprobs, echoed[prompt_index] = self._echo(prompt_index, output)
                    for chunk in self._echo_chunks(prompt_index, text, logprobs, output.prompt_token_ids):
                        yield chunk
                for delta in tracker.deltas(prompt_index, output):
                    offset = offsets.get(delta.index, echoed.get(prompt_index, 0))
                    first = delta.index not in started and not self.body.echo
                    started.add(delta.index)
                    chunk = self._chunk(delta, offset, output.prompt_token_ids if first else None)
                    if logprobs := chunk["choices"][0]["logprobs"]:
                        offsets[delta.index] = offset + sum(map(len, logprobs["tokens"]))
                    yield sse.event(chunk)
                lasts[prompt_index] = output
            if self.usage.include:
                yield sse.event({**self._envelope([]), "usage": self._usage(list(lasts.values()))})
        except RequestAborted as exc:
            yield sse_error(from_abort(exc))
        finally:
            self.submission.abort_unfinished()
        yield sse.DONE


def _after_echo(echoed: dict[str, Any] | None, completion: dict[str, Any] | None) -> dict[str, Any] | None:
    """A completion's logprobs, after the echoed prompt's where they were asked for."""
    if completion is None or echoed is None:
        return completion
    return {key: echoed[key] + completion[key] for key in completion}


def _prompt_logprobs_done(output: RequestOutput) -> bool:
    """Whether the prompt's logprobs, where asked for, are all computed (an echo waits for them)."""
    return output.prompt_logprobs is None or len(output.prompt_logprobs) == len(output.prompt_token_ids)
