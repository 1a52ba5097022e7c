"""What is new in each cumulative engine output since the last one a stream sent."""

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
    text_offset: int  # characters of this choice already sent before `text`


@dataclass(slots=True)
class _Sent:
    chars: int = 0
    tokens: int = 0
    finished: bool = False


@dataclass
class DeltaTracker:
    n: int
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
        text = completion.text[sent.chars:]
        finished = completion.finish_reason is not None
        if sent.finished or (not text and not finished):
            return None  # tokens whose text is held back (a partial stop string) go out later
        logprobs = completion.logprobs[sent.tokens:] if completion.logprobs is not None else None
        delta = ChoiceDelta(index, text, completion.token_ids[sent.tokens:], logprobs,
                            completion.finish_reason, completion.stop_reason, sent.chars)
        sent.chars, sent.tokens, sent.finished = len(completion.text), len(completion.token_ids), finished
        return delta
