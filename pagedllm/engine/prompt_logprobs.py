"""Prompt logprobs (SamplingParams.prompt_logprobs): each prompt token's logprob under the model given the tokens
before it, with the top-k alternatives there.

The logits at position p give token p + 1, so a prompt of P tokens has P - 1 entries after a leading None (the
first token has nothing before it). They come from the prefill chunks that compute positions 0..P-2: the runner
returns those rows after the step's sampling rows (SeqInput.prompt_logits). Positions served by the prefix cache
have no logits, so such a request takes from the cache only the positions it has entries for (after a preemption,
what it computed before); a recomputed chunk adds only the entries it did not have.
"""

from collections.abc import Callable

import torch

from pagedllm.engine.detokenizer import MAX_CHAR_BYTES
from pagedllm.engine.device import to_device, to_host
from pagedllm.engine.outputs import TokenLogprob
from pagedllm.engine.sampler import vocabulary_ranks
from pagedllm.engine.step import ScheduledSeq
from pagedllm.engine.step_logits import StepLogits
from pagedllm.engine.token_text import TokenText


def prompt_rows(s: ScheduledSeq) -> range:
    """Offsets into the step's new tokens of s whose logits give prompt entries it does not have yet."""
    if not s.request.needs_prompt_logits:
        return range(0)
    first = max(s.num_cached, s.request.num_prompt_positions_done)
    last = min(s.num_cached + s.num_new_tokens, len(s.request.prompt_token_ids) - 1)
    return range(first - s.num_cached, last - s.num_cached) if first < last else range(0)


def record_prompt_logprobs(scheduled: list[ScheduledSeq], rows: list[range], logits: StepLogits,
                           first_row: int, text_of: TokenText | None = None) -> None:
    """Append to each request the entries of its prompt rows; they start at logits row first_row, in order."""
    row = first_row
    for s, offsets in zip(scheduled, rows):
        if not offsets:
            continue
        request = s.request
        positions = range(s.num_cached + offsets.start, s.num_cached + offsets.stop)
        prompt = request.prompt_token_ids
        targets = prompt[positions.start + 1 : positions.stop + 1]
        full = logits.rows(list(range(row, row + len(offsets))))
        texts = None
        if text_of is not None and request.params.detokenize:
            texts = [text_of.in_context(prompt[max(0, p + 1 - MAX_CHAR_BYTES) : p + 1]) for p in positions]
        request.prompt_logprobs.extend(token_logprobs(full, targets, request.params.prompt_logprobs, texts))
        row += len(offsets)


def token_logprobs(logits: torch.Tensor, targets: list[int], k: int,
                   texts: list[Callable[[int], str]] | None = None) -> list[TokenLogprob]:
    """Per row of float32 logits [rows, vocab]: the target token's logprob and rank, and the top-k (raw
    log-softmax); texts: per row, its tokens' texts. The targets cross to the device in one copy and the
    results come back in one, as the sampler's do."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    index = to_device(torch.tensor(targets, dtype=torch.long), logprobs.device, "sampling rows")
    top_values, top_ids = logprobs.topk(k, dim=-1)
    chosen = logprobs.gather(1, index[:, None])
    ranks = vocabulary_ranks(logprobs, index[:, None])
    # float64 holds the ids exactly and the float32 logprobs unchanged
    parts = [chosen.double(), ranks.double(), top_values.double(), top_ids.double()]
    host = to_host(torch.cat(parts, dim=1), "prompt logprobs")
    chosen, ranks = host[:, 0].tolist(), host[:, 1].long().tolist()
    values, ids = host[:, 2 : 2 + k].tolist(), host[:, 2 + k :].long().tolist()
    rows = zip(targets, chosen, ranks, ids, values, texts or [None] * len(targets))
    return [TokenLogprob(target, value, dict(zip(row_ids, row_values)), rank, text_of)
            for target, value, rank, row_ids, row_values, text_of in rows]  # fmt: skip
