"""The output side of one sequence: its text, logprobs and sampling randomness.

Written by the output stages (sampling, detokenizing), never by the scheduler. Each output of a
request carries what is new since the previous one, so streaming callers never diff text."""

from dataclasses import dataclass
from typing import Protocol

import torch

from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.engine.thinking_budget import ThinkingBudget
from pagedllm.engine.outputs import CompletionOutput, TokenLogprob


class SeqView(Protocol):
    index: int
    output_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass(slots=True, eq=False)
class Completion:
    index: int
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    logprobs: list[TokenLogprob] | None = None  # a list when the request asked for logprobs
    grammar: object | None = None  # with structured outputs: the matcher of its tokens (engine/grammar.py)
    thinking: ThinkingBudget | None = None  # with a thinking_token_budget: where its reasoning stands
    cumulative_logprob: float = 0.0
    text: str = ""
    new_text: str = ""  # text added since the last output
    num_sent_tokens: int = 0  # output tokens already handed out

    def add_text(self, delta: str) -> None:
        self.text += delta
        self.new_text += delta


def completion_output(completion: Completion, seq: SeqView) -> CompletionOutput:
    """The completion so far and what is new since the previous call (which it marks as sent)."""
    ids = seq.output_ids
    sent = completion.num_sent_tokens
    logprobs = completion.logprobs
    out = CompletionOutput(
        index=seq.index,
        text=completion.text,
        token_ids=ids,
        logprobs=None if logprobs is None else list(logprobs),
        finish_reason=seq.finish_reason,
        cumulative_logprob=completion.cumulative_logprob,
        stop_reason=seq.stop_reason,
        new_text=completion.new_text,
        new_token_ids=ids[sent:],
        new_logprobs=None if logprobs is None else logprobs[sent:],
    )
    completion.num_sent_tokens, completion.new_text = len(ids), ""
    return out
