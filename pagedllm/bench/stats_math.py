"""Latency arithmetic shared by every benchmark: percentiles, summaries, TTFT / TPOT / ITL from timestamps.

Pure Python (no numpy, no torch) so the serving benchmark and tests can use it anywhere.
"""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Summary:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must lie in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(values: Sequence[float]) -> Summary:
    """count, mean, p50, p90, p99, min, max; NaN for an empty input (count 0)."""
    if not values:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Summary(
        count=len(values),
        mean=mean(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        min=min(values),
        max=max(values),
    )


def ttft(arrival_time: float, first_token_time: float) -> float:
    """Time to first token: from the request's arrival to its first output token."""
    return first_token_time - arrival_time


def tpot(first_token_time: float, last_token_time: float, num_output_tokens: int) -> float | None:
    """Time per output token after the first: (last - first) / (n - 1); None for a single token."""
    if num_output_tokens < 2:
        return None
    return (last_token_time - first_token_time) / (num_output_tokens - 1)


def itl(token_times: Sequence[float]) -> list[float]:
    """Inter-token latencies: the gaps between consecutive output tokens."""
    return [b - a for a, b in zip(token_times, token_times[1:])]


def e2e_latency(arrival_time: float, finished_time: float) -> float:
    return finished_time - arrival_time
