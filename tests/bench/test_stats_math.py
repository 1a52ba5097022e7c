"""Latency arithmetic: percentiles against numpy, summaries, TTFT / TPOT / ITL from known timestamps."""

import math

import numpy as np
import pytest

from pagedllm.bench.stats_math import e2e_latency, itl, mean, percentile, summarize, tpot, ttft


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(q):
    values = [7.0, 1.0, 3.5, 9.0, 2.0, 2.0, 11.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_known_values_and_edges():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize():
    s = summarize(list(range(1, 101)))
    assert (s.count, s.mean, s.p50, s.min, s.max) == (100, 50.5, 50.5, 1, 100)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert summarize([]).count == 0 and math.isnan(summarize([]).mean)
    assert set(s.to_dict()) == {"count", "mean", "p50", "p90", "p99", "min", "max"}


def test_latencies_from_timestamps():
    arrival, times = 100.0, [100.5, 100.7, 101.0, 101.6]
    assert ttft(arrival, times[0]) == pytest.approx(0.5)
    assert tpot(times[0], times[-1], len(times)) == pytest.approx(1.1 / 3)
    assert tpot(times[0], times[0], 1) is None
    assert itl(times) == pytest.approx([0.2, 0.3, 0.6])
    assert itl([1.0]) == []
    assert e2e_latency(arrival, 102.0) == 2.0
    assert mean([1, 2, 3]) == 2 and math.isnan(mean([]))
