"""Replay a request trace through a simulated continuous-batching loop, once per allocation policy.

No model runs. One step: arrivals join the waiting queue; every running request grows by one
token (if a paged request cannot, the latest-arrived running request is preempted: freed and
requeued at the front, to be recomputed later); finished requests leave and free their memory;
then waiting requests are admitted in FCFS order while the allocator accepts the head of the queue
(a paged request gets its prompt's blocks on admission, a contiguous one its whole run).
The memory state is measured at the end of each step.
"""

import bisect
from collections import deque
from collections.abc import Callable, Sequence

from pagedllm.errors import InvalidInputError
from pagedllm.sim.config import SimConfig
from pagedllm.sim.memory_map import MemoryMap
from pagedllm.sim.policies import Policy, make_policy
from pagedllm.sim.requests import SimRequest, prepare, sim_requests
from pagedllm.sim.result import PolicyResult, SimResult
from pagedllm.sim.trace import TraceRequest

__all__ = ["SimConfig", "SimResult", "simulate"]


class Replay:
    """One policy's run over the trace."""

    def __init__(self, policy: Policy, trace: Sequence[TraceRequest], max_len: int,
                 draw_step: int | None = None, on_finish: Callable[[int], None] | None = None,
                 check: bool = False) -> None:
        self.policy = policy
        self.check = check  # verify the report and the allocator's invariants every step (tests)
        self.pending = deque(sim_requests(trace, max_len))
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # sorted by (arrival, idx): the last is the latest arrived
        self.result = PolicyResult(policy.name, policy.report(None).pool)
        self.draw_step = draw_step
        self.memory_map: MemoryMap | None = None
        self.on_finish = on_finish

    def run(self) -> PolicyResult:
        step = 0
        while self.pending or self.waiting or self.running:
            if not self.waiting and not self.running:
                step = max(step, self.pending[0].arrival)  # skip idle steps
            self._step(step)
            step += 1
        self.result.steps = step
        return self.result

    def _step(self, step: int) -> None:
        while self.pending and self.pending[0].arrival <= step:
            self.waiting.append(self.pending.popleft())
        self._grow_all()
        self._retire()
        self._admit()
        self.policy.end_step()
        if not self.running and self.waiting:
            raise RuntimeError(f"{self.policy.name}: request {self.waiting[0].idx} cannot fit an empty pool")
        head = self.waiting[0] if self.waiting else None
        report = self.policy.report(head)
        if self.check:
            report.check()
            self.policy.check_invariants()
        self.result.record(step, report, len(self.running), len(self.waiting))
        if self.draw_step is not None and self.memory_map is None and step >= self.draw_step:
            self.memory_map = self.policy.memory_map(step, head)  # idle steps are skipped: the next busy one

    def _grow_all(self) -> None:
        i, victims = 0, []
        while i < len(self.running):
            req = self.running[i]
            if self.policy.grow(req):
                req.num_tokens += 1
                req.generated += 1
                i += 1
                continue
            victim = self.running.pop()  # the latest arrived; possibly req itself
            self.policy.release(victim)
            victim.num_tokens = 0
            victims.append(victim)
        self.result.preemptions += len(victims)
        self.waiting.extendleft(victims)  # latest first, so the earliest victim ends at the front

    def _retire(self) -> None:
        done = [r for r in self.running if r.num_tokens >= r.final_len]
        for req in done:
            self.policy.release(req)
        if done:
            self.running = [r for r in self.running if r.num_tokens < r.final_len]
            self.result.finished += len(done)
            if self.on_finish:
                self.on_finish(len(done))

    def _admit(self) -> None:
        while self.waiting and self.policy.admit(self.waiting[0]):
            req = self.waiting.popleft()
            req.num_tokens = req.prompt_len + req.generated
            bisect.insort(self.running, req, key=lambda r: (r.arrival, r.idx))



def simulate(trace: Sequence[TraceRequest], cfg: SimConfig, policies: Sequence[str] | None = None,
             draw_step: int | None = None, draw_policy: str | None = None,
             on_finish: Callable[[int], None] | None = None, check: bool = False) -> SimResult:
    """Run every policy (default: all of cfg.policy_names()) over the same trace and pool size."""
    names = list(policies) if policies is not None else cfg.policy_names()
    if draw_policy is not None and draw_policy not in names:
        raise InvalidInputError(f"unknown draw policy {draw_policy!r}; choose one of {', '.join(names)}")
    trace = prepare(trace, cfg.max_len)
    results: dict[str, PolicyResult] = {}
    memory_map = None
    for name in names:
        replay = Replay(make_policy(name, cfg), trace, cfg.max_len,
                        draw_step if name == draw_policy else None, on_finish, check)
        results[name] = replay.run()
        if name == draw_policy:
            memory_map = replay.memory_map
            if memory_map is None:
                raise InvalidInputError(f"cannot draw step {draw_step}: the {name} run ended at step {results[name].steps - 1}")
    return SimResult(cfg, len(trace), results, memory_map)
