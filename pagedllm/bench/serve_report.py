"""The serving benchmark's report as text for a terminal and as a Markdown table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E latency", "e2e_s"))
_STATS = ("mean", "p50", "p90", "p99")


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f}"


def conditions_line(report: dict[str, Any]) -> str:
    w, load, server = report["workload"], report["load"], report["server"]
    env = report["environment"]
    return (f"{report['engine']} at {server['base_url']} ({server['model']}); workload {w['name']} seed {w['seed']}: "
            f"{w['num_requests']} requests, {w['prompt_tokens']} prompt / {w['output_tokens']} output tokens; "
            f"rate {load['request_rate']}/s, max concurrency {load['max_concurrency'] or 'unbounded'}; "
            f"{env['cpu_model']}, {env['cpu_count']} CPUs")


def throughput_lines(m: dict[str, Any]) -> list[str]:
    return [f"completed {m['completed']}, failed {m['failed']}, in {m['duration_s']:.2f} s",
            f"request throughput {m['request_throughput']:.3f} req/s, output {m['output_throughput']:.1f} tok/s, "
            f"total {m['total_token_throughput']:.1f} tok/s"]


def render_text(report: dict[str, Any]) -> str:
    m = report["metrics"]
    lines = [conditions_line(report), *throughput_lines(m), f"{'ms':<12}" + "".join(f"{s:>10}" for s in _STATS)]
    for title, key in _LATENCIES:
        lines.append(f"{title:<12}" + "".join(f"{_ms(m[key][s]):>10}" for s in _STATS))
    lines += [f"error: {e}" for e in m["errors"]]
    return "\n".join(lines)


def render_markdown(report: dict[str, Any]) -> str:
    m = report["metrics"]
    lines = [f"Conditions: {conditions_line(report)}.", "", *(f"- {line}" for line in throughput_lines(m)), "",
             "| latency (ms) | " + " | ".join(_STATS) + " |", "|---|" + "---:|" * len(_STATS)]
    for title, key in _LATENCIES:
        lines.append(f"| {title} | " + " | ".join(_ms(m[key][s]) for s in _STATS) + " |")
    return "\n".join(lines) + "\n"


def write_output(path: str, text: str) -> None:
    """'-' writes to stdout."""
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
