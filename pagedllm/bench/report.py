"""Benchmark reports: a dict of results and conditions, written as a terminal table, JSON or Markdown."""

import json
import math
from pathlib import Path

from pagedllm.bench.engine_runner import RunResult

COLUMNS = [  # (header, key in run_to_dict, format)
    ("run", "label", "{}"),
    ("time s", "elapsed_s", "{:.1f}"),
    ("CPU s", "cpu_s", "{:.1f}"),
    ("req/s", "requests_per_s", "{:.2f}"),
    ("out tok/s", "output_tokens_per_s", "{:.1f}"),
    ("total tok/s", "total_tokens_per_s", "{:.1f}"),
    ("peak KV blocks", "peak_blocks", "{}"),
    ("seqs peak", "peak_running_seqs", "{}"),
    ("seqs mean", "mean_running_seqs", "{:.1f}"),
    ("KV waste", "mean_kv_waste", "{:.1%}"),
    ("prefix hit", "prefix_hit_rate", "{:.1%}"),
    ("preempt", "num_preemptions", "{}"),
    ("prompt steps s", "prompt_step_s", "{:.2f}"),
    ("decode step ms", "decode_step_ms", "{:.1f}"),
]


def run_to_dict(run: RunResult, with_timeline: bool = True) -> dict:
    out = {
        "label": run.label,
        "elapsed_s": run.elapsed_s,
        "cpu_s": run.cpu_s,
        "page_faults": run.page_faults,
        "num_requests": run.num_requests,
        "prompt_tokens": run.prompt_tokens,
        "output_tokens": run.output_tokens,
        "requests_per_s": run.requests_per_s,
        "output_tokens_per_s": run.output_tokens_per_s,
        "total_tokens_per_s": run.total_tokens_per_s,
        "steps": run.steps,
        "peak_blocks_used": run.peak_blocks_used,
        "num_blocks": run.num_blocks,
        "peak_blocks": None if run.peak_blocks_used is None else f"{run.peak_blocks_used}/{run.num_blocks}",
        "block_size": run.block_size,
        "prefix_hit_rate": run.prefix_hit_rate,
        "num_preemptions": run.num_preemptions,
        "mean_kv_waste": run.mean_waste,
        "peak_running_seqs": run.peak_running_seqs,
        "mean_running_seqs": run.mean_running_seqs,
        "prompt_step_s": run.prompt_step_s,  # the steps that computed prompt tokens, together
        "decode_step_ms": run.decode_step_ms,  # median of the steps of decodes only
        "ttft_s": run.ttft.to_dict() if run.ttft else None,
        "tpot_s": run.tpot.to_dict() if run.tpot else None,
        "config": run.config,
    }
    if with_timeline and run.samples:
        out["kv_timeline"] = {
            "time_s": [round(s.time_s, 4) for s in run.samples],
            "blocks_used": [s.blocks_used for s in run.samples],
            "running": [s.running for s in run.samples],
            "running_seqs": [s.running_seqs for s in run.samples],
            "step_s": [round(s.step_s, 5) for s in run.samples],
            "prompt_tokens": [s.prompt_tokens for s in run.samples],
        }
    return out


def ratio(a: RunResult, b: RunResult) -> float:
    """How many times a's output token rate is b's."""
    return a.output_tokens_per_s / b.output_tokens_per_s


def concurrency_ratio(a: RunResult, b: RunResult) -> dict[str, float | None]:
    """How many times as many sequences a ran at once as b: mean and peak per step."""
    return {"mean": _div(a.mean_running_seqs, b.mean_running_seqs), "peak": _div(a.peak_running_seqs, b.peak_running_seqs)}


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _rows(report: dict) -> list[list[str]]:
    return [[_cell(run.get(key), fmt) for _, key, fmt in COLUMNS] for run in report["runs"]]


def format_table(report: dict) -> str:
    """A plain-text table for the terminal, then the ratios."""
    headers = [h for h, _, _ in COLUMNS]
    rows = _rows(report)
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    text = [line(headers), line(["-" * w for w in widths]), *map(line, rows)]
    text += [_ratio_line(report, name, value) for name, value in report.get("ratios", {}).items()]
    return "\n".join(text)


def _ratio_line(report: dict, name: str, value: float) -> str:
    line = f"{name}: {value:.2f}x"
    seqs = report.get("concurrency_ratios", {}).get(name)
    if seqs:
        line += f" throughput, {_cell(seqs['mean'], '{:.2f}x')} running sequences (mean), {_cell(seqs['peak'], '{:.2f}x')} (peak)"
    each = report.get("repeat_ratios", {}).get(name)
    if each:
        line += f"; median of {len(each)} repeats: {', '.join(f'{r:.2f}x' for r in each)}"
    return line


def format_markdown(report: dict) -> str:
    """A Markdown section: conditions, workload, the results table and ratios."""
    headers = [h for h, _, _ in COLUMNS]
    out = [f"### {report['benchmark']}: {report['workload']['name']}", ""]
    out += [f"- {k}: {v}" for k, v in _conditions(report).items()]
    out += ["", "| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in _rows(report)]
    ratios = report.get("ratios", {})
    if ratios:
        out += [""] + [f"- **{_ratio_line(report, name, value)}**" for name, value in ratios.items()]
    return "\n".join(out) + "\n"


def _conditions(report: dict) -> dict[str, str]:
    env, w, eng = report["environment"], report["workload"], report.get("engine_config", {})
    return {
        "command": f"`{report['command']}`" if report.get("command") else "-",
        "model": f"{report['model']} ({eng.get('dtype', '?')})",
        "machine": f"{env['cpu_model']}, {env['threads']} threads, torch {env['torch_version']}",
        "pagedllm": f"{env['pagedllm_version']} @ {env['git_commit']}",
        "workload": f"{w['name']} seed {w['seed']}: {w['num_requests']} requests, prompts {_mmm(w['prompt_len'])}, "
        f"outputs {_mmm(w['output_len'])}, n {w['n']}{' (beam)' if w['beam'] else ''}",
        "engine": f"block size {eng.get('block_size')}, max_num_seqs {eng.get('max_num_seqs')}, "
        f"max_num_batched_tokens {eng.get('max_num_batched_tokens')}, KV memory {eng.get('kv_cache_memory')}",
    }


def _mmm(stats: dict) -> str:
    return f"{stats['min']}/{stats['mean']}/{stats['max']} (min/mean/max)"


def write_json(report: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(_clean(report), indent=2, allow_nan=False) + "\n")


def write_markdown(report: dict, path: str | Path) -> None:
    Path(path).write_text(format_markdown(report))


def _clean(value):
    """NaN (an empty summary) -> null, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value
