"""The peers comparison table over repeated offline runs (bench_peers.sh OFFLINE_REPEATS)."""

import json
from pathlib import Path

from pagedllm.bench.peers.compare import collect, render_markdown


def write_runs(run_dir: Path, ours: list[float], vllm: list[float]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "workload.jsonl").write_text(json.dumps({"prompt": [1, 2, 3], "max_tokens": 4}) + "\n")
    for i, (a, b) in enumerate(zip(ours, vllm), start=1):
        suffix = "" if i == 1 else f"-{i}"
        runs = [{"label": "pagedllm", "output_tokens_per_s": a}]
        if i == 1:
            runs.append({"label": "transformers (HF generate)", "output_tokens_per_s": 10.0})
        (run_dir / f"pagedllm-offline{suffix}.json").write_text(json.dumps({"runs": runs}))
        (run_dir / f"vllm-offline{suffix}.json").write_text(json.dumps({"output_tokens_per_s": b}))


def test_repeated_offline_runs_give_medians_and_their_ratio(tmp_path: Path) -> None:
    write_runs(tmp_path / "float32" / "mixed", ours=[130.0, 150.0, 120.0], vllm=[100.0, 90.0, 125.0])
    (tmp_path / "float32" / "mixed" / "vllm-offline-x.json").write_text("{}")  # not a repeat: ignored
    (entry,) = collect(tmp_path)
    assert entry["offline_runs"] == {"pagedllm": [130.0, 150.0, 120.0], "vLLM": [100.0, 90.0, 125.0],
                                     "transformers": [10.0]}
    assert entry["offline_output_tokens_per_s"] == {"pagedllm": 130.0, "vLLM": 100.0, "transformers": 10.0}
    assert entry["ratios"]["offline pagedllm / vLLM"] == 1.3
    text = render_markdown([entry])
    assert "| mixed | float32 | 130.0 | 100.0 | 10.0 | 1.30x | 13.00x |" in text
    assert "pagedllm 130.0, 150.0, 120.0; vLLM 100.0, 90.0, 125.0 (the table: medians)" in text


def test_one_offline_run_each_is_reported_as_before(tmp_path: Path) -> None:
    write_runs(tmp_path / "bfloat16" / "shared-prefix", ours=[200.0], vllm=[160.0])
    (entry,) = collect(tmp_path)
    assert entry["offline_output_tokens_per_s"]["pagedllm"] == 200.0
    assert entry["ratios"]["offline pagedllm / vLLM"] == 1.25
    assert "offline runs in turn" not in render_markdown([entry])
