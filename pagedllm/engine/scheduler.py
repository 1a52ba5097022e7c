"""Iteration-level scheduling: every step re-forms the batch under one token budget.

Running requests go first (oldest first), each sequence asking for its pending tokens (one for a
decode, a chunk for a prefill); then waiting requests join in arrival order while their tokens fit.
When the pool runs out, the latest-arrived running request is preempted: its blocks are freed (or
swapped out) and it waits at the front of the queue with its output so far.
"""

import time
from collections import deque
from dataclasses import dataclass, field

from pagedllm.config import EngineConfig
from pagedllm.engine.request import Request, RequestStatus, Sequence
from pagedllm.engine.reservation import ContiguousReservations
from pagedllm.kv.manager import KVCacheManager, PrefixHit


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    request: Request
    num_new_tokens: int
    needs_logits: bool = False  # this step computes the sequence's last known token: sample after it

    def __post_init__(self) -> None:
        self.needs_logits = self.seq.num_computed + self.num_new_tokens == len(self.seq.token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    cow: list[tuple[Request, int, int]] = field(default_factory=list)  # copy-on-write (owner, src, dst)
    preempted: list[Request] = field(default_factory=list)
    # (sequence, its block table): save K/V before the blocks are reused / restore into new blocks
    swap_out: list[tuple[Sequence, list[int]]] = field(default_factory=list)
    swap_in: list[tuple[Sequence, list[int]]] = field(default_factory=list)

    @property
    def copies(self) -> list[tuple[int, int]]:
        return [(src, dst) for _, src, dst in self.cow]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.swapped: set[str] = set()  # seq ids whose K/V live in swap space
        self.reservations = _reservations(config, kv, max_model_len)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out of the queues and free every block it holds."""
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)
        for seq in request.seqs:
            self.free_seq(seq)
        if self.reservations is not None:
            self.reservations.release(request)

    def free_seq(self, seq: Sequence) -> None:
        if self.kv.has_seq(seq.seq_id):
            self.kv.free(seq.seq_id)
        self.swapped.discard(seq.seq_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    # -- running ---------------------------------------------------------------------------

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted while making room for an earlier request
            wanted = self._wanted_tokens(request, budget, first=not out.scheduled)
            if not wanted:
                continue
            if not self._allocate_running(request, wanted, out):
                continue
            budget -= sum(wanted.values())
        return budget

    def _wanted_tokens(self, request: Request, budget: int, first: bool) -> dict[Sequence, int]:
        """Tokens each live sequence would compute this step; beams move together or not at all."""
        seqs = [s for s in request.live_seqs if s.num_pending > 0]
        if request.params.use_beam_search:
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
                victim = max(self.running, key=lambda r: r.metrics.arrival_time)
                self._preempt(victim, out)
                if victim is request:
                    return False
        out.scheduled.extend(ScheduledSeq(seq, request, n) for seq, n in wanted.items())
        return True

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        out.scheduled[:] = [s for s in out.scheduled if s.request is not request]
        out.cow[:] = [c for c in out.cow if c[0] is not request]  # its blocks are gone; nothing to copy
        swap = self.config.preemption_mode == "swap"
        for seq in request.seqs:
            if not self.kv.has_seq(seq.seq_id):
                continue
            if swap and seq.num_computed > 0:
                out.swap_out.append((seq, self.kv.block_table(seq.seq_id)))
                self.swapped.add(seq.seq_id)
            else:
                seq.num_computed = 0
            self.kv.free(seq.seq_id)
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted.append(request)

    # -- waiting ---------------------------------------------------------------------------

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0:
            request = self.waiting[0]
            if self._num_running_seqs() + len(request.live_seqs) > self.config.max_num_seqs:
                break
            if self.reservations is not None and not self.reservations.reserve(request):
                break
            taken = self._admit(request, budget, out)
            if taken is None:
                break  # first come, first served: nothing overtakes the head of the queue
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = time.time()
            budget -= taken

    def _num_running_seqs(self) -> int:
        return sum(len(r.live_seqs) for r in self.running)

    def _admit(self, request: Request, budget: int, out: SchedulerOutput) -> int | None:
        """Give every live sequence its cached prefix (or swapped-out K/V) and a first chunk; None if it does not fit."""
        plans = self._plan_admission(request, budget)
        wanted = sum(p.num_new for p in plans if not p.swapped)
        if request.params.use_beam_search and wanted > budget and out.scheduled:
            return None  # beams move together: wait for a step with room for all of them
        allocated: list[Sequence] = []
        for p in plans:
            if self.kv.allocate(p.seq.seq_id, p.seq.token_ids, p.num_new, p.prefix, request.extra_keys) is None:
                for seq in allocated:  # all or nothing: undo this request's admission
                    self.kv.free(seq.seq_id)
                return None
            allocated.append(p.seq)
        for p in plans:
            self._start_seq(request, p, out)
        return wanted

    def _plan_admission(self, request: Request, budget: int) -> list["Admission"]:
        plans = []
        for seq in request.live_seqs:
            if seq.seq_id in self.swapped:  # allocate room for its saved K/V; they are copied back before the step
                plans.append(Admission(seq, seq.num_computed, None, swapped=True))
                continue
            prefix = self.kv.lookup_prefix(seq.token_ids, request.extra_keys)
            num_new = min(len(seq.token_ids) - prefix.num_tokens, max(budget, 1))
            budget -= num_new
            plans.append(Admission(seq, num_new, prefix))
        return plans

    def _start_seq(self, request: Request, plan: "Admission", out: SchedulerOutput) -> None:
        seq = plan.seq
        if plan.swapped:
            out.swap_in.append((seq, self.kv.block_table(seq.seq_id)))
            self.swapped.discard(seq.seq_id)
            return  # its pending tokens are scheduled from the next step on
        seq.num_computed = plan.prefix.num_tokens
        if seq.num_prompt_tokens == len(seq.token_ids):
            request.metrics.num_cached_prompt_tokens = plan.prefix.num_tokens
        out.scheduled.append(ScheduledSeq(seq, request, plan.num_new))


@dataclass(slots=True)
class Admission:
    """How one sequence of a waiting request would join: its prefix-cache hit and first chunk."""

    seq: Sequence
    num_new: int  # slots to allocate beyond the hit (for a swapped sequence: its saved tokens)
    prefix: PrefixHit | None
    swapped: bool = False


def _reservations(config: EngineConfig, kv: KVCacheManager, max_model_len: int) -> ContiguousReservations | None:
    if config.allocator != "contiguous":
        return None
    return ContiguousReservations(kv.num_blocks * kv.block_size, max_model_len)
