"""What a simulation measured: per policy, occupancy, waste and concurrency over the run."""

from dataclasses import dataclass, field

from pagedllm.sim.accounting import MemoryReport
from pagedllm.sim.config import SimConfig
from pagedllm.sim.memory_map import MemoryMap


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

