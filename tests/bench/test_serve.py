"""`pagedllm bench serve` against a live pagedllm server on the tiny Llama (127.0.0.1 only)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # the server test harness

from server_harness import RunningServer, start_server  # noqa: E402

from pagedllm.bench import serve  # noqa: E402
from pagedllm.bench import cli as bench_cli  # noqa: E402
from pagedllm.bench.workloads import BenchRequest, Workload, save_jsonl  # noqa: E402
from pagedllm.config import EngineConfig  # noqa: E402

LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")


@pytest.fixture(scope="module")
def server(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    from pagedllm.engine.llm_engine import LLMEngine

    config = EngineConfig(model=str(tiny_llama_dir), block_size=8, num_blocks=512, max_num_seqs=16,
                          max_num_batched_tokens=512, max_model_len=512, max_n=4, served_model_name="tiny-llama")
    running = start_server(LLMEngine(config))
    yield running
    running.stop()


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return parser.parse_args(["serve", *argv])


def run_bench(tmp_path: Path, *argv: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    code = serve.run(bench_args(*argv, "--json", str(out)))
    # strict JSON: an empty summary must be null, never NaN
    report = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    return code, report


def assert_latencies_ordered(metrics: dict, count: int) -> None:
    for key in LATENCIES:
        s = metrics[key]
        assert s["count"] >= count if key == "itl_s" else s["count"] == count, key
        assert 0 < s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"], (key, s)
        assert s["min"] <= s["mean"] <= s["max"], (key, s)
    assert metrics["ttft_s"]["max"] <= metrics["e2e_s"]["max"]


def test_mixed_all_at_once_counts_and_latencies(server, tmp_path):
    code, report = run_bench(tmp_path, "--base-url", server.base_url, "--workload", "mixed",
                             "--num-requests", "6", "--seed", "3")
    m, w = report["metrics"], report["workload"]
    assert code == 0 and m["failed"] == 0 and m["completed"] == w["num_requests"] == 6
    assert w["vocab_size"] == 384  # read from the served model's config.json
    assert m["prompt_tokens"] == w["prompt_tokens"] and m["output_tokens"] == w["output_tokens"]  # ignore_eos
    assert_latencies_ordered(m, 6)
    assert m["output_throughput"] == pytest.approx(m["output_tokens"] / m["duration_s"])
    assert m["request_throughput"] == pytest.approx(6 / m["duration_s"])
    assert report["engine"] == "pagedllm" and report["server"]["model"] == "tiny-llama"
    assert report["load"] == {"request_rate": "inf", "max_concurrency": None, "ignore_eos": True,
                              "sample_seeds": True, "timeout_s": 1800.0}
    assert report["environment"]["cpu_count"] >= 1
    assert server.wait_idle().blocks_used == 0


def test_token_id_jsonl_with_n_poisson_and_concurrency_one(server, tmp_path):
    requests = [BenchRequest([20 + i, 30, 40, 50, 60], 5, n=2) for i in range(3)]
    save_jsonl(Workload("ids", 0, requests), tmp_path / "w.jsonl")
    code, report = run_bench(tmp_path, "--base-url", server.base_url, "--workload", str(tmp_path / "w.jsonl"),
                             "--request-rate", "50", "--max-concurrency", "1")
    m = report["metrics"]
    assert code == 0 and m["completed"] == 3 and m["prompt_tokens"] == 15
    assert m["output_tokens"] == 3 * 2 * 5  # n samples of max_tokens each
    assert_latencies_ordered(m, 3)
    assert report["load"]["request_rate"] == 50.0 and report["load"]["max_concurrency"] == 1


def test_concurrency_limit_serialises_requests(server):
    import asyncio

    from pagedllm.bench.serve_client import ClientOptions, run_requests

    requests = [BenchRequest([16, 17, 18, 19], 4) for _ in range(4)]
    opts = ClientOptions(server.base_url, "tiny-llama", max_concurrency=1, timeout_s=60)
    records, _ = asyncio.run(run_requests(requests, opts))
    spans = sorted((r.start, r.end) for r in records)
    assert all(r.ok and r.output_tokens == 4 for r in records)
    assert all(nxt[0] >= prev[1] for prev, nxt in zip(spans, spans[1:]))  # never two in flight


def test_run_timeout_cancels_and_reports_failures(server, tmp_path):
    code, report = run_bench(tmp_path, "--base-url", server.base_url, "--workload", "mixed",
                             "--num-requests", "4", "--timeout", "0.001")
    m = report["metrics"]
    assert code == 1 and m["completed"] + m["failed"] == 4 and m["failed"] >= 1
    assert m["errors"] and m["ttft_s"]["count"] == m["completed"]
    assert server.wait_idle().blocks_used == 0  # the server aborted what the client dropped


def test_markdown_and_text_reports(server, tmp_path, capsys):
    md = tmp_path / "r.md"
    assert serve.run(bench_args("--base-url", server.base_url, "--workload", "shared-prefix",
                                "--num-requests", "3", "--prefix-len", "32", "--md", str(md))) == 0
    text = md.read_text()
    assert "| TTFT |" in text and "| E2E latency |" in text and "completed 3, failed 0" in text
    assert serve.run(bench_args("--base-url", server.base_url, "--num-requests", "2")) == 0
    out = capsys.readouterr().out
    assert "TPOT" in out and "completed 2" in out


def test_bad_arguments_are_user_errors():
    from pagedllm.errors import InvalidInputError

    for argv in (["--request-rate", "0"], ["--max-concurrency", "0"], ["--timeout", "-1"], ["--vocab-size", "0"],
                 ["--num-requests", "0"]):
        with pytest.raises(InvalidInputError):
            serve.run(bench_args("--base-url", "http://127.0.0.1:9", *argv))


def test_starts_and_stops_its_own_pagedllm_server(tiny_llama_dir, tmp_path):
    code, report = run_bench(tmp_path, "--model", str(tiny_llama_dir), "--num-requests", "2",
                             "--serve-args", "--max-model-len 512 --num-blocks 256 --max-num-seqs 4",
                             "--ready-timeout", "120", "--timeout", "120")
    assert code == 0 and report["metrics"]["completed"] == 2
    launched = report["server"]["launched"]
    assert "--port 0" in launched and "--host 127.0.0.1" in launched and "--num-blocks 256" in launched
    assert report["server"]["base_url"].startswith("http://127.0.0.1:")
    assert not math.isnan(report["metrics"]["e2e_s"]["p99"])
