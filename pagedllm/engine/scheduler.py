"""The scheduler owns every sequence's life: add, admit, grow, fork, preempt, swap, finish, free.

Each step re-forms the batch under one token budget. Running requests go first (oldest first), each
sequence asking for its pending tokens (one for a decode, a chunk for a prefill); then waiting
requests join in arrival order while their tokens fit. When the pool runs out, the latest-arrived
running request is preempted: its blocks are freed (or swapped out) and it waits at the front of the
queue with its output so far. Under scheduling_policy="priority" each of those orders is by the
requests' priority first (lower first), then arrival, as in vLLM: both queues are kept in that order, the
lowest-ranked running request is the victim, and a preempted request waits in its place by rank. After
the model ran, `update` applies what the output stage found.
It is the only writer of a sequence's `num_computed`, tokens and blocks.
"""

import bisect
import time
from collections import deque
from dataclasses import dataclass

from pagedllm.config import EngineConfig
from pagedllm.engine.completion import Completion
from pagedllm.engine.concurrency import Concurrency
from pagedllm.engine.outcome import BeamChoice, StepOutcome
from pagedllm.engine.request import Request, RequestStatus, Sequence
from pagedllm.engine.reservation import ContiguousReservations
from pagedllm.engine.seq_registry import SeqRegistry
from pagedllm.engine.step import ScheduledSeq, SchedulerOutput
from pagedllm.engine.swap import SwapStore
from pagedllm.errors import InvalidInputError
from pagedllm.kv.block_table import blocks_needed
from pagedllm.kv.manager import KVCacheManager, PrefixHit


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int, swap: SwapStore,
                 swap_tokens: int | None = None) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.swap = swap  # K/V of swapped-out sequences (preemption_mode="swap")
        self.swap_tokens = swap_tokens  # the most tokens the swap space may hold (config.swap_space); None: no limit
        self.seqs = SeqRegistry()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.concurrency = Concurrency()
        self.reservations = _reservations(config, kv, max_model_len)
        self._arrivals = 0

    # -- requests come and go ------------------------------------------------------------------

    def check_request(self, prompt_len: int, width: int, max_tokens: int | None) -> int:
        """The request's longest possible length; InvalidInputError for one that can never be served."""
        if width > self.config.max_n:
            raise InvalidInputError(f"n / beam width {width} is above this engine's limit of {self.config.max_n} "
                                    "(max_n)")
        if width > self.config.max_num_seqs:
            raise InvalidInputError(f"n / beam width {width} is above max_num_seqs ({self.config.max_num_seqs})")
        if prompt_len >= self.max_model_len:
            raise InvalidInputError(
                f"prompt has {prompt_len} tokens; this model's maximum context length is {self.max_model_len} "
                f"(prompt + at least one output token must fit)"
            )
        max_total = min(prompt_len + (max_tokens or self.max_model_len), self.max_model_len)
        per_seq = self.max_model_len if self.reservations is not None else max_total  # contiguous: a max-length run
        blocks = blocks_needed(per_seq, self.kv.block_size) * width
        if blocks > self.kv.num_blocks:
            raise InvalidInputError(
                f"request needs up to {blocks} KV blocks ({width} x {per_seq} tokens) but the pool has only "
                f"{self.kv.num_blocks}; lower {'n' if self.reservations else 'max_tokens or n'}, or give the engine "
                f"more KV memory"
            )
        return max_total

    def add(self, request: Request, completion: Completion | None) -> None:
        """Queue a new request with its first sequence (the prompt); `completion` is that sequence's output side."""
        request.arrival_index = self._arrivals
        self._arrivals += 1
        request.seqs.append(self.seqs.new(request, list(request.prompt_token_ids), 0, completion))
        self._enqueue(self.waiting, request)

    def abort(self, request: Request) -> None:
        for seq in request.live_seqs:
            seq.finish_reason = "abort"
        self._finish_request(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def request_of(self, seq_id: int) -> Request:
        return self.seqs.request_of(seq_id)

    # -- one step ----------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:  # the pool just ran dry: admitting now would only preempt again
            self._schedule_waiting(out, budget)
        for s in out.scheduled:
            s.block_table = self.kv.block_table(s.seq.seq_id)
        self.concurrency.record(sum(len(r.live_seqs) for r in self.running) if out.scheduled else 0)
        return out

    def update(self, step: SchedulerOutput, outcome: StepOutcome) -> list[Request]:
        """Apply a step's results; returns the requests it touched, in schedule order."""
        for s in step.scheduled:
            s.seq.num_computed += s.num_new_tokens
        self._apply_tokens(outcome)
        for choice in outcome.beams:
            self._apply_beams(choice)
        now = time.time()
        for request in outcome.sampled:
            _record_token_time(request, now)
            if not request.live_seqs:
                self._finish_request(request)
        return list(dict.fromkeys(s.request for s in step.scheduled))

    # -- running -------------------------------------------------------------------------------------

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted while making room for an earlier request
            wanted = self._wanted_tokens(request, budget, first=not out.scheduled)
            if wanted and self._allocate_running(request, wanted, out):
                budget -= sum(wanted.values())
        return budget

    def _wanted_tokens(self, request: Request, budget: int, first: bool) -> dict[Sequence, int]:
        """Tokens each live sequence would compute this step; beams move together or not at all (a beam search's
        prompt, one sequence yet, chunks like any other)."""
        seqs = [s for s in request.live_seqs if s.num_pending > 0]
        if request.params.use_beam_search and len(request.live_seqs) > 1:
            total = sum(s.num_pending for s in seqs)
            return {s: s.num_pending for s in seqs} if total <= budget or first else {}
        wanted: dict[Sequence, int] = {}
        for seq in seqs:
            take = min(seq.num_pending, budget)
            if take <= 0:
                break
            wanted[seq] = take
            budget -= take
        return wanted

    def _allocate_running(self, request: Request, wanted: dict[Sequence, int], out: SchedulerOutput) -> bool:
        """Allocate slots for each sequence, preempting later arrivals when the pool runs dry."""
        for seq, num_new in wanted.items():
            while True:
                allocation = self.kv.allocate(seq.seq_id, seq.token_ids, num_new)
                if allocation is not None:
                    out.cow.extend((request, src, dst) for src, dst in allocation.copies)
                    break
                victim = max(self.running, key=self._rank)
                self._preempt(victim, out)
                if victim is request:
                    return False
        out.scheduled.extend(ScheduledSeq(seq, request, n) for seq, n in wanted.items())
        return True

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        out.scheduled[:] = [s for s in out.scheduled if s.request is not request]
        # Its copy-on-write copies queued this step are not made (its blocks go); a copy's target holds nothing
        # yet, so its K/V is still in the source, which a swap saves from instead.
        uncopied = {dst: src for r, src, dst in out.cow if r is request}
        out.cow[:] = [c for c in out.cow if c[0] is not request]
        held = [seq for seq in request.seqs if self.kv.has_seq(seq.seq_id)]
        # one choice for the whole request: a beam search step needs every live beam, and a swapped beam comes
        # back a step after a recomputed one would
        computed = sum(seq.num_computed for seq in held)
        swap = self.config.preemption_mode == "swap" and 0 < computed and self._swap_has_room(computed)
        for seq in held:
            self._evict(seq, uncopied, swap)
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(self.waiting, request, front=True)
        out.preempted.append(request)

    def _evict(self, seq: Sequence, uncopied: dict[int, int], swap: bool) -> None:
        """Give a preempted sequence's blocks back: its K/V saved aside (swap) or recomputed later."""
        num_computed = seq.num_computed
        if swap and num_computed > 0:
            blocks = [uncopied.get(b, b) for b in self.kv.block_table(seq.seq_id)]
            self.swap.save(seq.seq_id, blocks, seq.num_computed)
        else:
            seq.num_computed = 0
        self.kv.free(seq.seq_id, num_computed)

    def _swap_has_room(self, num_tokens: int) -> bool:
        return self.swap_tokens is None or self.swap.tokens_held + num_tokens <= self.swap_tokens

    # -- order -----------------------------------------------------------------------------------------

    def _rank(self, request: Request) -> tuple[float, ...]:
        """A request's place in both queues (smaller goes first): its arrival, or under the priority policy its
        priority, then its arrival."""
        arrival = (request.metrics.arrival_time, request.arrival_index)
        return (request.priority, *arrival) if self.config.scheduling_policy == "priority" else arrival

    def _enqueue(self, queue: deque[Request] | list[Request], request: Request, front: bool = False) -> None:
        """First come, first served: at the back, or at the front (a preempted request); under the priority policy
        in its place by rank."""
        if self.config.scheduling_policy == "priority":
            bisect.insort(queue, request, key=self._rank)
        elif front:
            queue.insert(0, request)
        else:
            queue.append(request)

    # -- waiting -------------------------------------------------------------------------------------

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0:
            request = self.waiting[0]
            if self._num_running_seqs() + _seq_demand(request) > self.config.max_num_seqs:
                break
            if self.reservations is not None and not self.reservations.reserve(request):
                break
            taken = self._admit(request, budget, out)
            if taken is None:
                break  # nothing overtakes the head of the queue (the first come, or the first in priority)
            self.waiting.popleft()
            self._enqueue(self.running, request)
            request.status = RequestStatus.RUNNING
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = time.time()
            budget -= taken

    @property
    def num_reserved_slots(self) -> int:
        """allocator="contiguous": the slots its reservations hold; 0 when paged."""
        return 0 if self.reservations is None else self.reservations.num_reserved_slots

    def _num_running_seqs(self) -> int:
        return sum(_seq_demand(r) for r in self.running)

    def _admit(self, request: Request, budget: int, out: SchedulerOutput) -> int | None:
        """Give every live sequence its cached prefix (or swapped-out K/V) and a first chunk; None if it does not fit."""
        plans = self._plan_admission(request, budget)
        if any(p.swapped for p in plans) and not self._room_to_swap_in(request):
            return None
        wanted = sum(p.num_new for p in plans if not p.swapped)
        if request.params.use_beam_search and wanted > budget and out.scheduled:
            return None  # beams move together: wait for a step with room for all of them
        allocated: list[Admission] = []
        for p in plans:
            if self.kv.allocate(p.seq.seq_id, p.seq.token_ids, p.num_new, p.prefix, request.extra_keys,
                                count_lookup=request.never_preempted) is None:
                for done in allocated:  # all or nothing: undo this request's admission (no K/V copied back yet)
                    self.kv.undo_admission(done.seq.seq_id, done.prefix.num_tokens if done.prefix else 0)
                return None
            allocated.append(p)
        for p in plans:
            self._start_seq(request, p, out)
        return wanted

    def _room_to_swap_in(self, request: Request) -> bool:
        """Whether the pool holds the request's K/V, saved and still to compute, and what every running sequence
        still needs, each with its next token: restored into the last free blocks, it would be the first victim
        of the next block a running sequence needs, swapped out again before computing a token (and again,
        every two steps)."""
        def blocks_to_grow(seq: Sequence) -> int:
            held = len(self.kv.block_table(seq.seq_id)) if self.kv.has_seq(seq.seq_id) else 0
            return max(0, blocks_needed(len(seq.token_ids) + 1, self.kv.block_size) - held)

        running = [s for r in self.running for s in r.live_seqs]
        return sum(map(blocks_to_grow, running + request.live_seqs)) <= self.kv.num_free_blocks

    def _plan_admission(self, request: Request, budget: int) -> list["Admission"]:
        plans = []
        # Beams (readmitted after a preemption) take all their tokens in one step: a beam search step needs every
        # beam's logits at once, and each beam's own prefix hit would leave them different chunks.
        whole = request.params.use_beam_search and len(request.live_seqs) > 1
        for seq in request.live_seqs:
            if seq.seq_id in self.swap:  # allocate room for its saved K/V, copied back at once
                plans.append(Admission(seq, seq.num_computed, None, swapped=True))
                continue
            prefix = self._cacheable_prefix(request, seq)
            num_new = len(seq.token_ids) - prefix.num_tokens
            num_new = num_new if whole else min(num_new, max(budget, 1))
            budget -= num_new
            plans.append(Admission(seq, num_new, prefix))
        return plans

    def _cacheable_prefix(self, request: Request, seq: Sequence) -> PrefixHit:
        """The prefix cache's hit, cut where prompt logprobs are still to be computed (cached positions give no
        logits): a request that asked for them takes from the cache only what it computed before a preemption."""
        hit = self.kv.lookup_prefix(seq.token_ids, request.extra_keys)
        if not request.needs_prompt_logits:
            return hit
        num_blocks = min(len(hit.blocks), request.num_prompt_positions_done // self.kv.block_size)
        return PrefixHit(hit.blocks[:num_blocks], num_blocks * self.kv.block_size)

    def _start_seq(self, request: Request, plan: "Admission", out: SchedulerOutput) -> None:
        seq = plan.seq
        if plan.swapped:
            self.swap.restore(seq.seq_id, self.kv.block_table(seq.seq_id))
            return  # its pending tokens are scheduled from the next step on
        seq.num_computed = plan.prefix.num_tokens
        if seq.num_prompt_tokens == len(seq.token_ids) and request.never_preempted:
            # a readmission's hit would count the request's own earlier blocks
            request.metrics.num_cached_prompt_tokens = plan.prefix.num_tokens
        out.scheduled.append(ScheduledSeq(seq, request, plan.num_new))

    # -- applying a step's outcome -----------------------------------------------------------------

    def _apply_tokens(self, outcome: StepOutcome) -> None:
        # Forks first: a new sequence copies its parent's tokens before the parent appends its own.
        targets = [self._fork(t.request, t.seq, t.completion.index, t.completion) if t.fork else t.seq
                   for t in outcome.tokens]
        for token, seq in zip(outcome.tokens, targets):
            seq.token_ids.append(token.token_id)
            if token.finish_reason is not None:
                self._finish_seq(seq, token.finish_reason, token.stop_reason)

    def _apply_beams(self, choice: BeamChoice) -> None:
        request, step = choice.request, choice.step
        seq_of = {seq.index: seq for seq in request.seqs}
        for parent_id, child_id in step.forks:  # before the parents append: children copy the current tokens
            seq_of[child_id] = self._fork(request, seq_of[parent_id], child_id, None)
        for beam_id in step.freed:
            self._free_seq(seq_of[beam_id])
            request.seqs.remove(seq_of[beam_id])
        for beam in step.live:
            seq = seq_of[beam.beam_id]
            seq.token_ids[seq.num_prompt_tokens :] = beam.token_ids

    def _fork(self, request: Request, parent: Sequence, index: int, completion: Completion | None) -> Sequence:
        child = self.seqs.new(request, list(parent.token_ids), index, completion)
        child.num_computed = parent.num_computed
        self.kv.fork(parent.seq_id, child.seq_id)
        request.seqs.append(child)
        return child

    def _finish_seq(self, seq: Sequence, reason: str, stop_reason: int | str | None) -> None:
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self._free_seq(seq)

    def _free_seq(self, seq: Sequence) -> None:
        """The sequence's life ends: its blocks, swapped K/V and id go."""
        if self.kv.has_seq(seq.seq_id):
            self.kv.free(seq.seq_id, seq.num_computed)
        self.swap.drop(seq.seq_id)
        self.seqs.release(seq.seq_id)

    def _finish_request(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)
        for seq in request.seqs:
            self._free_seq(seq)
        if self.reservations is not None:
            self.reservations.release(request)
        request.status = RequestStatus.FINISHED
        request.metrics.finished_time = time.time()


@dataclass(slots=True)
class Admission:
    """How one sequence of a waiting request would join: its prefix-cache hit and first chunk."""

    seq: Sequence
    num_new: int  # slots to allocate beyond the hit (for a swapped sequence: its saved tokens)
    prefix: PrefixHit | None
    swapped: bool = False


def _seq_demand(request: Request) -> int:
    """Sequences a request occupies: a fresh n > 1 or beam request will fork to its full width."""
    return request.width if request.is_fresh else len(request.live_seqs)


def _record_token_time(request: Request, now: float) -> None:
    if request.metrics.first_token_time is None:
        request.metrics.first_token_time = now
    request.metrics.token_times.append(now)


def _reservations(config: EngineConfig, kv: KVCacheManager, max_model_len: int) -> ContiguousReservations | None:
    if config.allocator != "contiguous":
        return None
    num_slots = kv.num_blocks * kv.block_size
    if max_model_len > num_slots:
        raise InvalidInputError(
            f'allocator="contiguous" reserves max_model_len ({max_model_len}) slots for every sequence but the pool '
            f"holds {num_slots}; lower max_model_len or give the engine more KV memory")
    return ContiguousReservations(num_slots, max_model_len)
