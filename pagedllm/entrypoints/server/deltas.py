"""Per choice, what a stream sends next: the engine's per-step additions, with tokens whose text is held back kept until
their text comes, and with vLLM's stream_interval, gathered until that many tokens are held."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedllm.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob


@dataclass(slots=True)
class ChoiceDelta:
    index: int  # the choice's index in the response (prompt_index * n + completion index)
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass(slots=True)
class _Sent:
    finished: bool = False
    any_sent: bool = False
    held_tokens: list[int] = field(default_factory=list)  # tokens not sent yet
    held_logprobs: list[TokenLogprob] = field(default_factory=list)
    held_text: str = ""  # their text so far (none where the engine holds it back: a partial stop string)


@dataclass
class DeltaTracker:
    n: int
    interval: int = 1  # tokens a delta gathers (vLLM's stream_interval); a choice's first and last go at once
    _sent: dict[int, _Sent] = field(default_factory=dict)

    def deltas(self, prompt_index: int, output: RequestOutput) -> list[ChoiceDelta]:
        result = []
        for completion in output.outputs:
            delta = self._delta(prompt_index * self.n + completion.index, completion)
            if delta is not None:
                result.append(delta)
        return result

    def _delta(self, index: int, completion: CompletionOutput) -> ChoiceDelta | None:
        sent = self._sent.setdefault(index, _Sent())
        if sent.finished:
            return None
        sent.held_tokens += completion.new_token_ids
        sent.held_logprobs += completion.new_logprobs or []
        sent.held_text += completion.new_text
        finished = completion.finish_reason is not None
        gathering = sent.any_sent and len(sent.held_tokens) < self.interval
        if not finished and (not sent.held_text or gathering):
            return None  # tokens whose text is held back go out with their text
        logprobs = sent.held_logprobs if completion.logprobs is not None else None
        delta = ChoiceDelta(index, sent.held_text, sent.held_tokens, logprobs,
                            completion.finish_reason, completion.stop_reason)
        sent.finished, sent.any_sent = finished, True
        sent.held_tokens, sent.held_logprobs, sent.held_text = [], [], ""
        return delta


class HeldTokens:
    """A streamed choice's tokens (and their logprobs) not yet sent: a delta's tokens wait here until the text they
    made goes out (a tool call or a tag is held back until whole)."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None

    def add(self, delta: ChoiceDelta) -> None:
        self.token_ids += delta.token_ids
        if delta.logprobs is not None:
            self.logprobs = self.logprobs or []
            self.logprobs.extend(delta.logprobs)

    def take(self) -> tuple[list[int], list[TokenLogprob] | None]:
        """The held tokens and their logprobs, as they go out now."""
        taken = self.token_ids, self.logprobs
        self.token_ids, self.logprobs = [], None
        return taken
