"""Report writers: the rates' arithmetic, strict JSON, Markdown table with conditions, terminal table."""

import json

import pytest

from pagedllm.bench.engine_runner import RunResult, StepSample
from pagedllm.bench.report import (
    concurrency_ratio, format_markdown, format_table, ratio, run_to_dict, write_json, write_markdown,
)
from pagedllm.bench.stats_math import summarize


def engine_run() -> RunResult:
    samples = [StepSample(0.5, 10, 150, 4, 2, 5, 0.5, 600), StepSample(1.0, 12, 180, 4, 0, 7, 0.25, 0),
               StepSample(1.5, 12, 187, 4, 0, 7, 0.75, 0)]
    return RunResult("pagedllm", elapsed_s=4.0, num_requests=8, prompt_tokens=600, output_tokens=200, steps=3,
                     peak_blocks_used=12, num_blocks=100, block_size=16, prefix_hit_rate=0.25, num_preemptions=1,
                     mean_waste=0.1, peak_running_seqs=7, mean_running_seqs=6.0, ttft=summarize([0.1, 0.3]),
                     tpot=summarize([]), samples=samples, cpu_s=7.5)  # fmt: skip


def contiguous_run() -> RunResult:
    return RunResult("pagedllm (contiguous)", elapsed_s=8.0, num_requests=8, prompt_tokens=600, output_tokens=200,
                     peak_running_seqs=2, mean_running_seqs=1.5)  # fmt: skip


def hf_run() -> RunResult:
    return RunResult("transformers", elapsed_s=10.0, num_requests=8, prompt_tokens=600, output_tokens=200, cpu_s=19.0)


def report() -> dict:
    return {
        "benchmark": "throughput",
        "command": "pagedllm bench throughput --baseline hf",
        "model": "tiny",
        "environment": {"cpu_model": "Test CPU", "threads": 2, "torch_version": "2.13.0", "pagedllm_version": "0.1.0",
                        "git_commit": "abc123"},  # fmt: skip
        "workload": {"name": "mixed", "seed": 0, "num_requests": 8, "prompt_len": {"min": 16, "mean": 75.0, "max": 200},
                     "output_len": {"min": 16, "mean": 25.0, "max": 40}, "n": [1], "beam": False},  # fmt: skip
        "engine_config": {"dtype": "float32", "block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 1024,
                          "kv_cache_memory": "2GiB"},  # fmt: skip
        "runs": [run_to_dict(engine_run()), run_to_dict(hf_run())],
        "ratios": {"pagedllm / transformers": ratio(engine_run(), hf_run()),
                   "paged / contiguous": ratio(engine_run(), contiguous_run())},
        "concurrency_ratios": {"paged / contiguous": concurrency_ratio(engine_run(), contiguous_run())},
    }


def test_rates_and_ratio():
    run = engine_run()
    assert (run.requests_per_s, run.output_tokens_per_s, run.total_tokens_per_s) == (2.0, 50.0, 200.0)
    assert run.prompt_step_s == 0.5 and run.decode_step_ms == pytest.approx(500.0)  # the decodes' median
    assert hf_run().prompt_step_s is None and hf_run().decode_step_ms is None
    assert ratio(run, hf_run()) == pytest.approx(2.5)
    assert concurrency_ratio(run, contiguous_run()) == {"mean": 4.0, "peak": 3.5}
    assert concurrency_ratio(run, hf_run()) == {"mean": None, "peak": None}  # no step figures to compare


def test_json_is_strict_and_complete(tmp_path):
    path = tmp_path / "r.json"
    write_json(report(), path)
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    first = data["runs"][0]
    assert first["output_tokens_per_s"] == 50.0 and first["peak_blocks"] == "12/100"
    assert first["tpot_s"]["mean"] is None  # empty summary: NaN written as null
    timeline = first["kv_timeline"]
    assert timeline["blocks_used"] == [10, 12, 12] and timeline["running_seqs"] == [5, 7, 7]
    assert timeline["step_s"] == [0.5, 0.25, 0.75] and timeline["prompt_tokens"] == [600, 0, 0]
    assert (first["prompt_step_s"], first["decode_step_ms"]) == (0.5, 500.0)
    assert (first["peak_running_seqs"], first["mean_running_seqs"]) == (7, 6.0)
    assert data["concurrency_ratios"]["paged / contiguous"] == {"mean": 4.0, "peak": 3.5}
    assert data["runs"][1]["peak_blocks_used"] is None and "kv_timeline" not in data["runs"][1]
    assert data["ratios"]["pagedllm / transformers"] == pytest.approx(2.5)


def test_markdown_has_conditions_table_and_ratio(tmp_path):
    md = format_markdown(report())
    assert "`pagedllm bench throughput --baseline hf`" in md
    assert "Test CPU, 2 threads, torch 2.13.0" in md and "0.1.0 @ abc123" in md
    assert "prompts 16/75.0/200 (min/mean/max)" in md
    assert "| pagedllm | 4.0 | 7.5 | 2.00 | 50.0 | 200.0 | 12/100 | 7 | 6.0 | 10.0% | 25.0% | 1 | 0.50 | 500.0 |" in md
    assert "| transformers | 10.0 | 19.0 | 0.80 | 20.0 | 80.0 | - | - | - | - | - | - | - | - |" in md
    assert "**pagedllm / transformers: 2.50x**" in md
    assert "**paged / contiguous: 2.00x throughput, 4.00x running sequences (mean), 3.50x (peak)**" in md
    write_markdown(report(), tmp_path / "r.md")
    assert (tmp_path / "r.md").read_text() == md


def test_terminal_table_aligns_columns():
    lines = format_table(report()).splitlines()
    assert lines[0].startswith("run") and set(lines[1]) <= {"-", " "}
    assert len({len(line) for line in lines[:4]}) == 1  # header, rule and rows share one width
    assert lines[-2:] == ["pagedllm / transformers: 2.50x",
                          "paged / contiguous: 2.00x throughput, 4.00x running sequences (mean), 3.50x (peak)"]
