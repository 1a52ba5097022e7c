"""The serving benchmark's arithmetic on known timestamps, its arrival process and the peers table."""

from __future__ import annotations

import json
import math

import pytest

from pagedllm.bench.peers import compare
from pagedllm.bench.serve_client import RequestRecord, arrival_offsets
from pagedllm.bench.serve_metrics import compute_metrics, request_itls, request_tpot


def record(index: int, start: float, times: dict[int, list[float]], end: float, out: int, n: int = 1) -> RequestRecord:
    chunks = sorted(t for ts in times.values() for t in ts)
    return RequestRecord(index=index, n=n, prompt_tokens=10, output_tokens=out, start=start,
                         chunk_times=chunks, choice_times=times, end=end)


def test_one_request_known_timestamps():
    r = record(0, 10.0, {0: [11.0, 12.0, 13.0, 15.0]}, 15.5, out=4)
    m = compute_metrics([r], duration_s=8.0)
    assert m.ttft_s.mean == pytest.approx(1.0)
    assert m.tpot_s.mean == pytest.approx((15.0 - 11.0) / 3)
    assert sorted(request_itls(r)) == pytest.approx([1.0, 1.0, 2.0])
    assert m.itl_s.p50 == pytest.approx(1.0) and m.itl_s.max == pytest.approx(2.0)
    assert m.e2e_s.mean == pytest.approx(5.5)
    assert m.output_throughput == pytest.approx(4 / 8.0) and m.request_throughput == pytest.approx(1 / 8.0)
    assert m.total_token_throughput == pytest.approx(14 / 8.0)


def test_coalesced_chunks_count_tokens_not_chunks():
    # 5 tokens in 3 chunks: TPOT divides by the 4 tokens after the first, ITL sees 2 gaps
    r = record(0, 0.0, {0: [1.0, 2.0, 3.0]}, 3.0, out=5)
    assert request_tpot(r) == pytest.approx(0.5)
    assert request_itls(r) == pytest.approx([1.0, 1.0])


def test_n_samples_are_timed_per_completion():
    # two samples of 3 tokens each, interleaved in one stream
    r = record(0, 0.0, {0: [1.0, 2.0, 3.0], 1: [1.5, 3.5, 5.5]}, 6.0, out=6, n=2)
    assert request_tpot(r) == pytest.approx(((3.0 - 1.0) / 2 + (5.5 - 1.5) / 2) / 2)
    assert sorted(request_itls(r)) == pytest.approx([1.0, 1.0, 2.0, 2.0])
    assert compute_metrics([r], 6.0).ttft_s.mean == pytest.approx(1.0)


def test_failures_are_counted_and_left_out_of_latencies():
    good = [record(i, 0.0, {0: [0.1 * (i + 1), 1.0]}, 1.0, out=2) for i in range(10)]
    bad = RequestRecord(index=10, error="HTTP 503: overloaded")
    m = compute_metrics([*good, bad], duration_s=2.0)
    assert (m.completed, m.failed, m.output_tokens) == (10, 1, 20)
    assert m.errors == ["request 10: HTTP 503: overloaded"]
    assert m.ttft_s.p50 == pytest.approx(0.55) and m.ttft_s.p90 == pytest.approx(0.91)
    assert m.ttft_s.p50 <= m.ttft_s.p90 <= m.ttft_s.p99


def test_single_token_outputs_have_no_tpot():
    m = compute_metrics([record(0, 0.0, {0: [0.5]}, 0.6, out=1)], 1.0)
    assert m.tpot_s.count == 0 and math.isnan(m.tpot_s.p50) and m.itl_s.count == 0


def test_poisson_arrivals_seeded_and_at_the_rate():
    a = arrival_offsets(2000, rate=4.0, seed=7)
    assert a == arrival_offsets(2000, rate=4.0, seed=7) and a != arrival_offsets(2000, rate=4.0, seed=8)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert a[-1] / (len(a) - 1) == pytest.approx(0.25, rel=0.1)  # mean gap 1 / rate
    assert arrival_offsets(3, math.inf, 0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0, 0)


def _write(path, payload) -> None:
    path.write_text(json.dumps(payload))


def test_comparison_table_and_ratios(tmp_path):
    run = tmp_path / "float32" / "mixed"
    run.mkdir(parents=True)
    (run / "workload.jsonl").write_text('{"prompt": [16, 17, 18], "max_tokens": 4, "n": 1}\n'
                                        '{"prompt": [19, 20], "max_tokens": 2, "n": 2}\n')
    _write(run / "pagedllm-offline.json", {"runs": [{"label": "pagedllm (paged)", "output_tokens_per_s": 300.0},
                                                    {"label": "transformers generate", "output_tokens_per_s": 30.0}]})
    _write(run / "vllm-offline.json", {"output_tokens_per_s": 150.0})
    summary = {"count": 2, "mean": 0.2, "p50": 0.1, "p90": 0.3, "p99": 0.4, "min": 0.1, "max": 0.4}
    metrics = {"output_throughput": 100.0, "request_throughput": 1.5, "failed": 0,
               **{k: summary for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s")}}
    _write(run / "pagedllm-serve.json", {"metrics": metrics})
    (run / "vllm-serve.err").write_text("log line\nConnectionError: refused\n")
    (run / "vllm-offline.load").write_text("1.5\n2.25\n")
    [entry] = compare.collect(tmp_path)
    assert entry["ratios"]["offline pagedllm / vLLM"] == pytest.approx(2.0)
    assert entry["ratios"]["offline pagedllm / transformers"] == pytest.approx(10.0)
    assert entry["ratios"]["served pagedllm / vLLM"] is None
    assert entry["workload_stats"] == {"num_requests": 2, "prompt_tokens": 5, "prompt_len": [2, 3],
                                       "output_tokens": 8, "n": [1, 2]}
    assert entry["errors"] == {"vllm-serve": "ConnectionError: refused"}
    md = compare.render_markdown([entry])
    assert "| mixed | float32 | 300.0 | 150.0 | 30.0 | 2.00x | 10.00x |" in md
    assert "| mixed | float32 | pagedllm | 100.0 | 1.50 | 100 / 400 | 100 / 400 | 100 | 100 / 400 | 0 |" in md
    assert "| mixed | float32 | vLLM | - |" in md and "vllm-serve failed: `ConnectionError: refused`" in md
    assert entry["loadavg"] == {"vllm-offline": [1.5, 2.25]} and "vllm-offline 1.5→2.2" in md


def test_request_body_streams_token_ids_with_ignore_eos_and_optional_seeds():
    from pagedllm.bench.serve_client import ClientOptions, request_body
    from pagedllm.bench.workloads import BenchRequest

    opts = ClientOptions("http://127.0.0.1:1", "m", seed=5)
    body = request_body(2, BenchRequest([16, 17], 8, n=3), opts)
    assert body["prompt"] == [16, 17] and body["max_tokens"] == 8 and body["n"] == 3
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"]
    assert body["temperature"] == 1.0 and body["seed"] == 7
    unseeded = ClientOptions("http://127.0.0.1:1", "m", seed=5, seed_samples=False)
    assert "seed" not in request_body(2, BenchRequest([16], 8, n=3), unseeded)
    greedy = request_body(0, BenchRequest([16], 8), opts)
    assert greedy["temperature"] == 0.0 and "seed" not in greedy


def test_latency_percentile_plot_is_written(tmp_path):
    from pagedllm.bench.plots import plot_latency_percentiles

    summary = {"p50": 0.1, "p90": 0.2, "p99": 0.3}
    report = {"engine": "pagedllm", "workload": {"name": "mixed"},
              "metrics": {"ttft_s": summary, "tpot_s": summary, "itl_s": summary, "e2e_s": None}}
    path = tmp_path / "latency.png"
    plot_latency_percentiles([report, dict(report, engine="other")], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
