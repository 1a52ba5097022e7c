"""After the forward pass: sample, fork n > 1 sequences, advance beams, detokenize, stop, free."""

import time
from typing import TYPE_CHECKING

import torch

from pagedllm.engine.outputs import TokenLogprob
from pagedllm.engine.request import Request, RequestStatus, Sequence
from pagedllm.engine.sampler import SampleResult, SamplingRow, sample
from pagedllm.engine.scheduler import ScheduledSeq, SchedulerOutput

if TYPE_CHECKING:
    from pagedllm.engine.llm_engine import LLMEngine


class StepPostprocessor:
    def __init__(self, engine: "LLMEngine") -> None:
        self.engine = engine

    def new_sequence(self, request: Request, seq_id: str, token_ids: list[int], index: int) -> Sequence:
        from pagedllm.engine.detokenizer import IncrementalDetokenizer

        seq = Sequence(seq_id, token_ids, len(request.prompt_token_ids), index=index)
        if request.params.logprobs is not None:
            seq.logprobs = []
        stop_ids = frozenset(request.params.stop_ids(self.engine.eos_token_ids))
        seq.detokenizer = IncrementalDetokenizer(self.engine.tokenizer, request.params, request.prompt_token_ids, stop_ids)
        seq.generator = self.engine.generator_for(request.params, index)
        return seq

    def start_beam_search(self, request: Request) -> None:
        from pagedllm.engine.beam_driver import start_beam_search

        start_beam_search(self, request)

    def process(self, out: SchedulerOutput, logits: torch.Tensor) -> list[Request]:
        """Consume the logits rows (one per scheduled sequence that needs logits, in order)."""
        groups = _rows_by_request([s for s in out.scheduled if s.needs_logits])
        rows: list[SamplingRow] = []
        targets: list[tuple[Request, Sequence, int]] = []
        now = time.time()
        for request, items in groups.items():
            if request.params.use_beam_search:
                from pagedllm.engine.beam_driver import beam_step

                beam_step(self, request, [(s, i) for s, i in items], logits)
                continue
            if request.is_fresh and request.params.n > 1:
                items = self._fork_parallel(request, items)
            for seq, row in items:
                rows.append(SamplingRow(request.params, seq.generator, request.prompt_token_ids, seq.output_ids))
                targets.append((request, seq, row))
        if rows:
            picked = logits[torch.tensor([row for _, _, row in targets], dtype=torch.long)]
            for (request, seq, _), result in zip(targets, sample(picked, rows, self.engine.eos_token_ids)):
                self.append_token(request, seq, result)
        touched = list(dict.fromkeys(s.request for s in out.scheduled))
        for request in groups:
            _record_token_time(request, now)
            if not request.live_seqs:
                self.finish_request(request)
        return touched

    def _fork_parallel(self, request: Request, items: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """The prompt is prefilled once; n - 1 children share its blocks and sample from the same logits row."""
        parent, row = items[0]
        for index in range(1, request.params.n):
            child = self.fork(request, parent, index)
            items.append((child, row))
        return items

    def fork(self, request: Request, parent: Sequence, index: int) -> Sequence:
        child = self.new_sequence(request, request.new_seq_id(), list(parent.token_ids), index)
        child.num_computed = parent.num_computed
        child.cumulative_logprob = parent.cumulative_logprob
        self.engine.kv.fork(parent.seq_id, child.seq_id)
        request.seqs.append(child)
        return child

    def append_token(self, request: Request, seq: Sequence, result: SampleResult) -> None:
        token = result.token_id
        seq.token_ids.append(token)
        seq.cumulative_logprob += result.logprob
        if seq.logprobs is not None:
            seq.logprobs.append(TokenLogprob(token, result.logprob, result.top_logprobs or {}))
        seq.text += seq.detokenizer.append(token)
        self.engine.generation_tokens_total += 1
        reason = self._finish_reason(request, seq, token)
        if reason is not None:
            self.finish_seq(seq, reason)

    def _finish_reason(self, request: Request, seq: Sequence, token: int) -> str | None:
        params = request.params
        num_out = len(seq.token_ids) - seq.num_prompt_tokens
        if seq.detokenizer.stop_reason is not None:
            seq.stop_reason = seq.detokenizer.stop_reason
            return "stop"
        if num_out >= params.min_tokens and token in params.stop_ids(self.engine.eos_token_ids):
            seq.stop_reason = token if token in params.stop_token_ids else None
            return "stop"
        if len(seq.token_ids) >= request.max_total_len:
            return "length"
        return None

    def finish_seq(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        seq.text += seq.detokenizer.finish()
        self.engine.scheduler.free_seq(seq)

    def finish_request(self, request: Request) -> None:
        self.engine.scheduler.remove(request)
        request.status = RequestStatus.FINISHED
        request.metrics.finished_time = time.time()


def _rows_by_request(needing: list[ScheduledSeq]) -> dict[Request, list[tuple[Sequence, int]]]:
    groups: dict[Request, list[tuple[Sequence, int]]] = {}
    for row, s in enumerate(needing):
        groups.setdefault(s.request, []).append((s.seq, row))
    return groups


def _record_token_time(request: Request, now: float) -> None:
    if request.metrics.first_token_time is None:
        request.metrics.first_token_time = now
    request.metrics.token_times.append(now)
