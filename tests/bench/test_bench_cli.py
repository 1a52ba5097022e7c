"""`pagedllm bench throughput / sweep` end to end on the tiny model, and the HF baseline's weights."""

import argparse
import json

import pytest
import torch

from pagedllm.bench import cli as bench_cli
from pagedllm.entrypoints.cli import main


def test_subcommands_registered():
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    args = parser.parse_args(["throughput", "--workload", "beam", "--baseline", "hf"])
    assert (args.workload, args.baseline, args.hf_batch_size) == ("beam", "hf", 16)
    args = parser.parse_args(["sweep", "--parameter", "max-num-seqs", "--values", "1,2"])
    assert args.parameter == "max-num-seqs"


def test_throughput_with_hf_baseline_writes_json(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main(["bench", "throughput", "--model", str(tiny_llama_dir), "--workload", "mixed", "--num-requests", "6",
                 "--max-model-len", "256", "--block-size", "8", "--kv-cache-memory", "4MiB", "--baseline", "hf", "--hf-batch-size", "4",
                 "--json", str(out), "--md", str(tmp_path / "r.md"), "--no-progress"])  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    engine, hf = data["runs"]
    stats = data["workload"]
    assert stats["num_requests"] == 6 and stats["prompt_len"]["max"] + stats["output_len"]["max"] <= 256 + 128
    for run in (engine, hf):
        assert run["output_tokens"] == stats["output_tokens"]
        assert isinstance(run["page_faults"], int) and run["page_faults"] >= 0
        assert run["output_tokens_per_s"] == pytest.approx(run["output_tokens"] / run["elapsed_s"])
        assert run["total_tokens_per_s"] == pytest.approx((run["prompt_tokens"] + run["output_tokens"]) / run["elapsed_s"])
    assert 0 < engine["peak_blocks_used"] <= engine["num_blocks"]
    assert len(engine["kv_timeline"]["blocks_used"]) == engine["steps"] >= stats["output_len"]["max"]  # a token a step
    assert engine["peak_running_seqs"] == max(engine["kv_timeline"]["running_seqs"]) >= 1
    timeline = engine["kv_timeline"]
    assert sum(timeline["prompt_tokens"]) == engine["prompt_tokens"] and timeline["prompt_tokens"][0] > 0
    assert engine["prompt_step_s"] == pytest.approx(sum(t for t, p in zip(timeline["step_s"], timeline["prompt_tokens"]) if p), abs=1e-3)
    assert 0 < engine["decode_step_ms"] < 1e3 * max(timeline["step_s"]) + 1e-3 and hf["decode_step_ms"] is None
    assert engine["ttft_s"]["count"] == 6 and engine["num_preemptions"] == 0
    assert hf["config"]["batch_size"] == 4
    ratio = data["ratios"]["pagedllm / transformers"]
    assert ratio == pytest.approx(engine["output_tokens_per_s"] / hf["output_tokens_per_s"])
    env = data["environment"]
    assert env["threads"] == torch.get_num_threads() and env["torch_version"] == torch.__version__ and env["cpu_model"]
    assert data["engine_config"]["block_size"] == 8 and data["model"] == tiny_llama_dir.name
    assert (data["engine_config"]["device"], data["engine_config"]["enforce_eager"]) == ("auto", False)
    assert "pagedllm / transformers" in capsys.readouterr().out
    assert "| pagedllm (paged, prefix cache on) |" in (tmp_path / "r.md").read_text()


def test_shared_prefix_comparison_hits_the_cache(tiny_llama_dir, tmp_path):
    out = tmp_path / "prefix.json"
    main(["bench", "throughput", "--model", str(tiny_llama_dir), "--workload", "shared-prefix", "--num-requests", "4",
          "--prefix-len", "64", "--block-size", "8", "--kv-cache-memory", "4MiB", "--compare-prefix-caching", "--json", str(out),
          "--no-progress"])  # fmt: skip
    on, off = json.loads(out.read_text())["runs"]
    assert on["prefix_hit_rate"] > 0.2 and off["prefix_hit_rate"] == 0.0
    assert on["config"]["enable_prefix_caching"] and not off["config"]["enable_prefix_caching"]


def test_repeats_alternate_the_runs_and_report_medians(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "repeats.json"
    main(["bench", "throughput", "--model", str(tiny_llama_dir), "--workload", "shared-prefix", "--num-requests", "4",
          "--prefix-len", "64", "--block-size", "8", "--kv-cache-memory", "4MiB", "--compare-prefix-caching",
          "--repeats", "3", "--json", str(out), "--no-progress"])  # fmt: skip
    data = json.loads(out.read_text())
    each = data["repeat_ratios"]["prefix caching on / off"]
    assert data["repeats"] == 3 and len(each) == 3 and data["ratios"]["prefix caching on / off"] == sorted(each)[1]
    on, off = data["runs"]  # each configuration's median run, fresh engines: the cached run hits only its own prefix
    assert on["prefix_hit_rate"] > 0.2 and off["prefix_hit_rate"] == 0.0
    assert "concurrency_ratios" in data and "prefix caching on / off" in data["concurrency_ratios"]
    assert "median of 3 repeats: " in capsys.readouterr().out


def test_repeats_must_be_positive(tiny_llama_dir, capsys):
    code = main(["bench", "throughput", "--model", str(tiny_llama_dir), "--repeats", "0", "--no-progress"])
    assert code != 0 and "--repeats must be >= 1, got 0" in capsys.readouterr().err


def test_sweep_writes_points_and_plot(tiny_llama_dir, tmp_path):
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    main(["bench", "sweep", "--model", str(tiny_llama_dir), "--values", "2,16", "--num-requests", "4",
          "--max-model-len", "256", "--kv-cache-memory", "4MiB", "--json", str(out), "--plot", str(png), "--no-progress"])  # fmt: skip
    data = json.loads(out.read_text())
    assert [p["value"] for p in data["points"]] == [2, 16] and data["parameter"] == "block_size"
    small, large = data["points"]
    assert 0 <= small["mean_kv_waste"] < large["mean_kv_waste"] < 1  # bigger blocks, emptier tails
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hf_baseline_model_has_the_engine_weights(tiny_llama_dir):
    from pagedllm.bench.hf_baseline import hf_model_from, left_pad
    from pagedllm.model.loader import load_model

    model, config = load_model(tiny_llama_dir)
    hf = hf_model_from(model, config)
    ids, mask = left_pad([[5, 6, 7], [9, 10, 11, 12, 13]], pad_token_id=0)
    assert ids[0].tolist() == [0, 0, 5, 6, 7] and mask[0].tolist() == [0, 0, 1, 1, 1]
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(hf(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits)


def test_contiguous_allocator_admits_fewer_sequences(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "alloc.json"
    main(["bench", "throughput", "--model", str(tiny_llama_dir), "--num-requests", "8", "--max-model-len", "256",
          "--block-size", "8", "--kv-cache-memory", "512KiB", "--compare-allocators", "--json", str(out),
          "--no-progress"])  # fmt: skip
    data = json.loads(out.read_text())
    paged, contiguous = data["runs"]
    assert contiguous["config"]["allocator"] == "contiguous" and "paged / contiguous" in data["ratios"]
    # 512 KiB holds a few 256-token reservations of this model (how many depends on the resolved dtype),
    # but more actual sequences
    fit = contiguous["num_blocks"] * 8 // 256
    assert max(contiguous["kv_timeline"]["running"]) <= fit < max(paged["kv_timeline"]["running"])
    for run in (paged, contiguous):  # sequences per step, reported beside the blocks
        busy = [n for n in run["kv_timeline"]["running_seqs"] if n]
        assert run["peak_running_seqs"] == max(busy) and run["mean_running_seqs"] == pytest.approx(sum(busy) / len(busy))
    assert contiguous["peak_running_seqs"] <= fit < paged["peak_running_seqs"]
    seqs = data["concurrency_ratios"]["paged / contiguous"]
    assert seqs["mean"] == pytest.approx(paged["mean_running_seqs"] / contiguous["mean_running_seqs"]) and seqs["mean"] > 1
    assert seqs["peak"] == pytest.approx(paged["peak_running_seqs"] / contiguous["peak_running_seqs"])
    printed = capsys.readouterr().out
    ratio_line = f"paged / contiguous: {data['ratios']['paged / contiguous']:.2f}x throughput, {seqs['mean']:.2f}x running"
    assert ratio_line in printed


def test_profile_step_splits_the_run_and_lists_the_top_functions(tiny_llama_dir, capsys):
    from pagedllm.bench.profile_step import main as profile_main

    assert profile_main(["--model", str(tiny_llama_dir), "--workload", "mixed", "--num-requests", "4",
                         "--max-model-len", "256", "--no-progress", "--top", "3"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    for line in ("output tok/s over", "engine step (total)", "Python and everything else", "Ordered by: internal time"):
        assert line in out
    assert "List reduced from" in out and "to 3 due to restriction" in out


def test_a_report_path_without_its_folder_is_refused_before_the_run(tiny_llama_dir, tmp_path, capsys):
    missing = tmp_path / "no-such-folder" / "out.json"
    code = main(["bench", "throughput", "--model", str(tiny_llama_dir), "--num-requests", "2", "--no-progress",
                 "--json", str(missing)])
    assert code == 2 and "no folder" in capsys.readouterr().err


@pytest.mark.parametrize("option, value, message", [
    ("--plot", "out.txt", "name a .png file"), ("--md", "", "needs a path"), ("--hf-batch-size", "0", "must be >= 1"),
])  # fmt: skip
def test_bad_report_options_are_refused_before_the_run(tiny_llama_dir, tmp_path, capsys, option, value, message):
    code = main(["bench", "throughput", "--model", str(tmp_path / "never-loaded"), option, value, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_text_prompt_is_checked_against_the_model_length_once_tokenized(tiny_llama_dir, tmp_path, capsys):
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "hi", "max_tokens": 100000}) + "\n")
    code = main(["bench", "throughput", "--model", str(tiny_llama_dir), "--workload", str(workload),
                 "--kv-cache-memory", "4MiB", "--no-progress"])  # fmt: skip
    assert code == 2 and "does not fit the model's length 512" in capsys.readouterr().err


def test_a_file_that_cannot_be_written_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    from pagedllm.entrypoints import convert_cmd

    def run(args):  # what writing into a path under a file raises
        (tmp_path / "a-file").write_text("")
        (tmp_path / "a-file" / "out").mkdir()

    monkeypatch.setattr(convert_cmd, "run", run)
    code = main(["convert", "--to-hf", str(tmp_path / "a-file" / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("pagedllm convert: error:") and "Traceback" not in err
