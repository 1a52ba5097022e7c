"""Beam search in the engine: each beam is a sequence; beams fork and free KV blocks as they are chosen."""

from typing import TYPE_CHECKING

import torch

from pagedllm.engine.beam import BeamSearch
from pagedllm.engine.outputs import CompletionOutput
from pagedllm.engine.request import Request, Sequence, seq_id, split_seq_id

if TYPE_CHECKING:
    from pagedllm.engine.postprocess import StepPostprocessor


def start_beam_search(post: "StepPostprocessor", request: Request) -> None:
    max_tokens = request.max_total_len - len(request.prompt_token_ids)
    request.beam = BeamSearch(
        request.params, post.engine.eos_token_ids, max_tokens, root_id=0, new_id=request.next_number
    )


def beam_step(post: "StepPostprocessor", request: Request, items: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
    """Advance every live beam by one token; all of them computed their last token this step."""
    search: BeamSearch = request.beam
    row_of = {_number(seq): row for seq, row in items}
    seq_of = {_number(seq): seq for seq in request.seqs}
    step = search.step(logits[[row_of[b.beam_id] for b in search.live]])
    for parent_id, child_id in step.forks:  # before the parents append: children copy the current tokens
        seq_of[child_id] = _fork(post, request, seq_of[parent_id], child_id)
    for beam_id in step.freed:
        post.engine.scheduler.free_seq(seq_of[beam_id])
        request.seqs.remove(seq_of[beam_id])
    for beam in step.live:
        seq = seq_of[beam.beam_id]
        seq.token_ids[seq.num_prompt_tokens :] = beam.token_ids
        seq.cumulative_logprob = beam.cum_logprob
    post.engine.generation_tokens_total += len(step.live)
    if step.done:
        request.final_outputs = _final_outputs(post, request, search)


def _fork(post: "StepPostprocessor", request: Request, parent: Sequence, number: int) -> Sequence:
    child = Sequence(seq_id(request.request_id, number), list(parent.token_ids), parent.num_prompt_tokens)
    child.num_computed = parent.num_computed
    post.engine.kv.fork(parent.seq_id, child.seq_id)
    request.seqs.append(child)
    return child


def _final_outputs(post: "StepPostprocessor", request: Request, search: BeamSearch) -> list[CompletionOutput]:
    tokenizer = post.engine.tokenizer
    skip = request.params.skip_special_tokens
    return [
        CompletionOutput(
            index=i,
            text=tokenizer.decode(h.token_ids, skip_special_tokens=skip),
            token_ids=list(h.token_ids),
            logprobs=None,
            finish_reason=h.finish_reason,
            cumulative_logprob=h.cum_logprob,
        )
        for i, h in enumerate(search.best())
    ]


def _number(seq: Sequence) -> int:
    return split_seq_id(seq.seq_id)[1]
