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
from dataclasses import dataclass, field

from pagedllm.errors import InvalidInputError
from pagedllm.kv.accounting import MemoryReport, contiguous_report, paged_report
from pagedllm.kv.contiguous import ContiguousAllocator
from pagedllm.kv.draw import MapEntry, MemoryMap
from pagedllm.kv.ids import SeqId
from pagedllm.kv.manager import KVCacheManager
from pagedllm.kv.trace import TraceRequest

DEFAULT_POOL_SLOTS = 32768  # 16 max-length (2048) reservations
DEFAULT_BLOCK_SIZES = (1, 4, 16, 64, 256)
DEFAULT_PREFIX_BLOCK_SIZE = 16
_PRIVATE_TOKEN_BASE = 1 << 40  # token ids: group text < 2**40 <= private text, so they never collide
_MAX_POSITIONS = 1 << 20  # positions fit the low 20 bits of a synthetic token id


@dataclass(slots=True)
class SimConfig:
    pool_slots: int = DEFAULT_POOL_SLOTS
    max_len: int = 2048
    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    prefix_block_size: int | None = DEFAULT_PREFIX_BLOCK_SIZE  # None: no prefix-sharing policy
    contiguous: tuple[str, ...] = ("max_len", "exact")

    def __post_init__(self) -> None:
        if not 2 <= self.max_len <= _MAX_POSITIONS:
            raise InvalidInputError(f"max-len must lie in [2, {_MAX_POSITIONS}], got {self.max_len}")
        if self.pool_slots < self.max_len:
            raise InvalidInputError(
                f"pool of {self.pool_slots} slots cannot hold one max-length ({self.max_len}) request")
        sizes = list(self.block_sizes) + ([self.prefix_block_size] if self.prefix_block_size is not None else [])
        for b in sizes:
            if b <= 0:
                raise InvalidInputError(f"block size must be positive, got {b}")
            if self.pool_slots % b:
                raise InvalidInputError(f"pool of {self.pool_slots} slots is not a whole number of {b}-slot blocks")

    def policy_names(self) -> list[str]:
        names = [f"contig-{'max' if c == 'max_len' else c}" for c in self.contiguous]
        names += [f"paged-{b}" for b in self.block_sizes]
        if self.prefix_block_size is not None:
            names.append(f"prefix-{self.prefix_block_size}")
        return names


@dataclass(slots=True)
class SimRequest:
    """One request's life in one policy's run."""

    idx: int
    seq_id: SeqId
    arrival: int
    prompt_len: int
    max_tokens: int
    final_len: int
    group: int | None  # index of its prefix group, if any
    prefix_len: int
    num_tokens: int = 0  # tokens with KV in the pool now (0 while waiting)
    generated: int = 0  # survives preemption: a recomputed request restarts at prompt + generated

    def token_id(self, pos: int) -> int:
        if self.group is not None and pos < self.prefix_len:
            return ((self.group + 1) << 20) + pos
        return _PRIVATE_TOKEN_BASE + (self.idx << 20) + pos


def prepare(trace: Sequence[TraceRequest], max_len: int) -> list[TraceRequest]:
    """Validate against max_len and sort by arrival (stable)."""
    for i, req in enumerate(trace):
        if req.prompt_len >= max_len:
            raise InvalidInputError(
                f"request {i} (arrival {req.arrival}): prompt_len {req.prompt_len} leaves no room "
                f"to generate within max-len {max_len}")
    return sorted(trace, key=lambda r: r.arrival)


def _sim_requests(trace: Sequence[TraceRequest], max_len: int) -> list[SimRequest]:
    groups: dict[int | str, int] = {}
    out = []
    for i, t in enumerate(trace):
        max_tokens = t.max_tokens if t.max_tokens is not None else max_len - t.prompt_len
        final = min(t.prompt_len + min(t.output_len, max_tokens), max_len)
        group = None if t.prefix_group is None else groups.setdefault(t.prefix_group, len(groups))
        prefix_len = t.prompt_len if t.prefix_len is None else t.prefix_len
        out.append(SimRequest(i, SeqId(f"r{i}"), t.arrival, t.prompt_len, max_tokens, final, group, prefix_len))
    return out


# --- policies -------------------------------------------------------------------------------------
class ContiguousPolicy:
    def __init__(self, name: str, cfg: SimConfig, kind: str) -> None:
        self.name = name
        self.alloc = ContiguousAllocator(cfg.pool_slots, cfg.max_len, kind)  # type: ignore[arg-type]

    def admit(self, req: SimRequest) -> bool:
        res = self.alloc.allocate(req.seq_id, req.prompt_len + req.generated, req.max_tokens, req.final_len)
        return res is not None

    def grow(self, req: SimRequest) -> bool:
        return self.alloc.append(req.seq_id)

    def release(self, req: SimRequest) -> None:
        self.alloc.free(req.seq_id)

    def report(self, head: SimRequest | None) -> MemoryReport:
        need = None if head is None else self.alloc.reservation_size(head.prompt_len, head.max_tokens)
        return contiguous_report(self.alloc, need)

    def check_invariants(self) -> None:
        self.alloc.check_invariants()

    def memory_map(self, step: int, head: SimRequest | None) -> MemoryMap:
        entries = [MapEntry(r.seq_id, r.used, r.final_len, r.reserved, start=r.start)
                   for r in self.alloc.reservations()]
        need = None if head is None else self.alloc.reservation_size(head.prompt_len, head.max_tokens)
        return MemoryMap(self.name, step, self.alloc.num_slots, None, entries, report=self.report(head),
                         free_runs=self.alloc.free_runs(), next_need=need)


class PagedPolicy:
    def __init__(self, name: str, cfg: SimConfig, block_size: int, prefix: bool) -> None:
        self.name = name
        self.block_size = block_size
        self.prefix = prefix
        self.manager = KVCacheManager(cfg.pool_slots // block_size, block_size, enable_prefix_caching=prefix)
        self._final: dict[SeqId, int] = {}
        self._tokens: dict[SeqId, list[int]] = {}  # real token ids, kept only when prefixes are shared

    def _token_ids(self, req: SimRequest, n: int) -> Sequence[int]:
        # Without prefix caching the manager only checks the length, so a range stands in for the tokens.
        return [req.token_id(p) for p in range(n)] if self.prefix else range(n)

    def admit(self, req: SimRequest) -> bool:
        n = req.prompt_len + req.generated
        tokens = self._token_ids(req, n)
        hit = self.manager.lookup_prefix(tokens)
        if self.manager.allocate(req.seq_id, tokens, n - hit.num_tokens, prefix=hit) is None:
            return False
        self._final[req.seq_id] = req.final_len
        if self.prefix:
            self._tokens[req.seq_id] = tokens  # type: ignore[assignment]
        return True

    def grow(self, req: SimRequest) -> bool:
        n = req.num_tokens + 1
        if not self.prefix:
            return self.manager.allocate(req.seq_id, range(n), 1) is not None
        tokens = self._tokens[req.seq_id]
        tokens.append(req.token_id(req.num_tokens))
        if self.manager.allocate(req.seq_id, tokens, 1) is None:
            tokens.pop()
            return False
        return True

    def release(self, req: SimRequest) -> None:
        self.manager.free(req.seq_id)
        del self._final[req.seq_id]
        self._tokens.pop(req.seq_id, None)

    def report(self, head: SimRequest | None) -> MemoryReport:
        return paged_report(self.manager, self.block_size, self._final)

    def check_invariants(self) -> None:
        self.manager.check_invariants()
        # accounting assumes only private tail blocks are partly filled; the manager counts slot by slot
        counted, stored = self.report(None).tokens, self.manager.stats().tokens_stored
        assert counted == stored, f"{self.name}: accounting sees {counted} tokens, the manager {stored}"

    def memory_map(self, step: int, head: SimRequest | None) -> MemoryMap:
        m = self.manager
        entries = [MapEntry(sid, m.num_tokens(sid), final, len(m.block_table(sid)) * self.block_size,
                            blocks=m.block_table(sid)) for sid, final in self._final.items()]
        cached = [b.block_id for b in m.snapshot() if b.state == "cached"] if self.prefix else []
        return MemoryMap(self.name, step, m.num_blocks * self.block_size, self.block_size, entries,
                         report=self.report(head), cached_blocks=cached)


Policy = ContiguousPolicy | PagedPolicy


def make_policy(name: str, cfg: SimConfig) -> Policy:
    if name not in cfg.policy_names():
        raise InvalidInputError(f"unknown policy {name!r}; choose one of {', '.join(cfg.policy_names())}")
    kind, _, arg = name.partition("-")
    if kind == "contig":
        return ContiguousPolicy(name, cfg, "max_len" if arg == "max" else arg)
    return PagedPolicy(name, cfg, int(arg), prefix=kind == "prefix")


# --- results --------------------------------------------------------------------------------------
@dataclass(slots=True)
class PolicyResult:
    policy: str
    pool_slots: int
    steps: int = 0
    finished: int = 0
    preemptions: int = 0
    busy_steps: int = 0  # steps with at least one running request: the averages are over these
    peak_step: int = -1  # the step of peak token occupancy
    peak: MemoryReport | None = None
    sums: dict[str, float] = field(default_factory=dict)  # category -> sum of slots over busy steps
    peak_running: int = 0
    sum_running: int = 0
    peak_waiting: int = 0  # > 0: the pool was a bottleneck at some point
    utilization: list[float] = field(default_factory=list)  # token occupancy per recorded step
    running: list[int] = field(default_factory=list)

    def record(self, step: int, rep: MemoryReport, num_running: int, num_waiting: int) -> None:
        self.peak_waiting = max(self.peak_waiting, num_waiting)
        self.utilization.append(rep.tokens / rep.pool)
        self.running.append(num_running)
        if num_running == 0:
            return
        self.busy_steps += 1
        self.sum_running += num_running
        self.peak_running = max(self.peak_running, num_running)
        for key in ("tokens", "reservation", "internal", "external"):
            self.sums[key] = self.sums.get(key, 0) + getattr(rep, key)
        if self.peak is None or rep.tokens > self.peak.tokens:
            self.peak, self.peak_step = rep, step

    def mean_pct(self, key: str) -> float:
        return 100.0 * self.sums.get(key, 0) / max(1, self.busy_steps) / self.pool_slots

    def peak_pct(self, key: str) -> float:
        return 0.0 if self.peak is None else self.peak.pct(getattr(self.peak, key))

    @property
    def mean_running(self) -> float:
        return self.sum_running / max(1, self.busy_steps)

    def summary(self) -> dict[str, object]:
        waste = ("reservation", "internal", "external")
        return {
            "pool_slots": self.pool_slots,
            "util_mean_pct": self.mean_pct("tokens"),
            "util_peak_pct": self.peak_pct("tokens"),
            "peak_step": self.peak_step,
            "waste_at_peak_pct": {k: self.peak_pct(k) for k in waste} | {"total": sum(self.peak_pct(k) for k in waste)},
            "waste_mean_pct": {k: self.mean_pct(k) for k in waste} | {"total": sum(self.mean_pct(k) for k in waste)},
            "peak_running": self.peak_running,
            "mean_running": self.mean_running,
            "peak_waiting": self.peak_waiting,
            "finished": self.finished,
            "steps": self.steps,
            "preemptions": self.preemptions,
        }


# --- the loop -------------------------------------------------------------------------------------
class Replay:
    """One policy's run over the trace."""

    def __init__(self, policy: Policy, trace: Sequence[TraceRequest], max_len: int,
                 draw_step: int | None = None, on_finish: Callable[[int], None] | None = None,
                 check: bool = False) -> None:
        self.policy = policy
        self.check = check  # verify the report and the allocator's invariants every step (tests)
        self.pending = deque(_sim_requests(trace, max_len))
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


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    num_requests: int
    policies: dict[str, PolicyResult]
    memory_map: MemoryMap | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "config": {"pool_slots": self.config.pool_slots, "max_len": self.config.max_len,
                       "block_sizes": list(self.config.block_sizes),
                       "prefix_block_size": self.config.prefix_block_size, "num_requests": self.num_requests},
            "policies": {name: r.summary() for name, r in self.policies.items()},
        }


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
