"""How many sequences run at once, step by step: the figure that paging is meant to raise."""

from dataclasses import dataclass


@dataclass(slots=True)
class Concurrency:
    steps: int = 0  # steps that ran at least one sequence
    peak: int = 0
    total: int = 0  # sum over those steps of the sequences running
    last: int = 0  # sequences running in the latest step

    def record(self, num_running: int) -> None:
        self.last = num_running
        if num_running <= 0:
            return
        self.steps += 1
        self.total += num_running
        self.peak = max(self.peak, num_running)

    @property
    def mean(self) -> float:
        return self.total / self.steps if self.steps else 0.0
