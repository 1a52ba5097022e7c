"""One comparison table from the peers runs: pagedllm vs vLLM vs transformers, offline and served.

Reads the results scripts/bench_peers.sh leaves under OUT/<dtype>/<workload>/:
  pagedllm-offline.json  `pagedllm bench throughput --baseline hf` (runs[0] pagedllm, runs[1] transformers)
  vllm-offline.json      pagedllm/bench/peers/vllm_offline.py
  pagedllm-offline-2.json, vllm-offline-2.json, ...: further offline runs (OFFLINE_REPEATS), taken in turn;
                         the offline columns give each engine's median
  pagedllm-serve.json    `pagedllm bench serve` against a `pagedllm serve` it started
  vllm-serve.json        `pagedllm bench serve --base-url` against `vllm serve`
<name>.err (the failure's last log lines) for a run that failed, and <name>.load (the 1-minute load
average before and after the run: these machines are shared, so the table says how busy it was).

    python -m pagedllm.bench.peers.compare out/peers --md out/peers/comparison.md --json out/peers/comparison.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

SERVED = ("pagedllm", "vLLM")


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _error(run_dir: Path, name: str) -> str | None:
    err = run_dir / f"{name}.err"
    return err.read_text().strip().splitlines()[-1][:300] if err.is_file() and err.read_text().strip() else None


def _repeats(run_dir: Path, name: str) -> list[Path]:
    """NAME.json, then NAME-2.json, NAME-3.json ... (bench_peers.sh's OFFLINE_REPEATS), those that exist."""
    numbered = {}
    for path in run_dir.glob(f"{name}-*.json"):
        if (index := path.stem[len(name) + 1:]).isdigit():
            numbered[int(index)] = path
    return [p for p in [run_dir / f"{name}.json", *(numbered[i] for i in sorted(numbered))] if p.is_file()]


def offline_runs(run_dir: Path) -> dict[str, list[float]]:
    """Output tokens/s of every offline run of each engine (every request at once), in the order they ran."""
    ours = [_load(p) for p in _repeats(run_dir, "pagedllm-offline")]
    hf = [r for report in ours for r in report["runs"] if "transformers" in r["label"].lower()]
    return {
        "pagedllm": [report["runs"][0]["output_tokens_per_s"] for report in ours if report["runs"]],
        "vLLM": [_load(p)["output_tokens_per_s"] for p in _repeats(run_dir, "vllm-offline")],
        "transformers": [r["output_tokens_per_s"] for r in hf],
    }


def medians(runs: dict[str, list[float]]) -> dict[str, float | None]:
    """Each engine's median output tokens/s over its offline runs (one run: that run's)."""
    return {engine: statistics.median(rates) if rates else None for engine, rates in runs.items()}


def served_metrics(run_dir: Path) -> dict[str, dict[str, Any] | None]:
    out = {}
    for engine, name in (("pagedllm", "pagedllm-serve"), ("vLLM", "vllm-serve")):
        report = _load(run_dir / f"{name}.json")
        out[engine] = report["metrics"] if report else None
    return out


def _loadavg(run_dir: Path, name: str) -> list[float] | None:
    path = run_dir / f"{name}.load"
    return [float(x) for x in path.read_text().split()] if path.is_file() else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def collect(out_dir: Path) -> list[dict[str, Any]]:
    """One entry per <dtype>/<workload> directory."""
    entries = []
    for run_dir in sorted(p for p in out_dir.glob("*/*") if p.is_dir() and (p / "workload.jsonl").is_file()):
        runs, served = offline_runs(run_dir), served_metrics(run_dir)
        offline = medians(runs)
        serve_rate = {k: (m or {}).get("output_throughput") for k, m in served.items()}
        names = ("pagedllm-offline", "vllm-offline", "pagedllm-serve", "vllm-serve")
        entries.append({
            "dtype": run_dir.parent.name, "workload": run_dir.name,
            "workload_stats": _workload_stats(run_dir / "workload.jsonl"),
            "offline_output_tokens_per_s": offline, "offline_runs": runs, "served": served,
            "ratios": {"offline pagedllm / vLLM": _ratio(offline["pagedllm"], offline["vLLM"]),
                       "offline pagedllm / transformers": _ratio(offline["pagedllm"], offline["transformers"]),
                       "served pagedllm / vLLM": _ratio(serve_rate["pagedllm"], serve_rate["vLLM"])},
            "errors": {n: e for n in names if (e := _error(run_dir, n))},
            "loadavg": {n: load for n in names if (load := _loadavg(run_dir, n))},
            "conditions": _conditions(run_dir),
        })
    return entries


def _workload_stats(path: Path) -> dict[str, Any]:
    reqs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    prompt = [len(r["prompt"]) for r in reqs]
    return {"num_requests": len(reqs), "prompt_tokens": sum(prompt), "prompt_len": [min(prompt), max(prompt)],
            "output_tokens": sum(r["max_tokens"] * r.get("n", 1) for r in reqs),
            "n": sorted({r.get("n", 1) for r in reqs})}


def _conditions(run_dir: Path) -> dict[str, Any]:
    cond = _load(run_dir / "conditions.json") or {}
    ours = _load(run_dir / "pagedllm-offline.json")
    if ours:
        cond["pagedllm_engine_config"] = ours.get("engine_config")
        cond["environment"] = ours.get("environment")
    vllm = _load(run_dir / "vllm-offline.json")
    if vllm:
        cond["vllm_environment"] = vllm.get("environment")
    return cond


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _ms(metrics: dict[str, Any] | None, key: str, stat: str) -> str:
    value = (metrics or {}).get(key, {}) or {}
    return _f(value.get(stat) * 1000 if value.get(stat) is not None else None, "{:.0f}")


def offline_table(entries: list[dict[str, Any]]) -> list[str]:
    lines = ["| workload | dtype | pagedllm tok/s | vLLM tok/s | transformers tok/s | pagedllm / vLLM "
             "| pagedllm / transformers |", "|---|---|---:|---:|---:|---:|---:|"]
    for e in entries:
        r, x = e["offline_output_tokens_per_s"], e["ratios"]
        lines.append(f"| {e['workload']} | {e['dtype']} | {_f(r['pagedllm'])} | {_f(r['vLLM'])} | "
                     f"{_f(r['transformers'])} | {_f(x['offline pagedllm / vLLM'], '{:.2f}x')} | "
                     f"{_f(x['offline pagedllm / transformers'], '{:.2f}x')} |")
    return lines


def served_table(entries: list[dict[str, Any]]) -> list[str]:
    lines = ["| workload | dtype | server | out tok/s | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
             "| ITL p50 ms | E2E p50 / p99 ms | failed |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for e in entries:
        for engine in SERVED:
            m = e["served"][engine]
            lines.append(
                f"| {e['workload']} | {e['dtype']} | {engine} | {_f((m or {}).get('output_throughput'))} | "
                f"{_f((m or {}).get('request_throughput'), '{:.2f}')} | "
                f"{_ms(m, 'ttft_s', 'p50')} / {_ms(m, 'ttft_s', 'p99')} | "
                f"{_ms(m, 'tpot_s', 'p50')} / {_ms(m, 'tpot_s', 'p99')} | {_ms(m, 'itl_s', 'p50')} | "
                f"{_ms(m, 'e2e_s', 'p50')} / {_ms(m, 'e2e_s', 'p99')} | {(m or {}).get('failed', '-')} |")
    return lines


def render_markdown(entries: list[dict[str, Any]]) -> str:
    repeats = [f"- {e['workload']} {e['dtype']}: offline runs in turn, pagedllm "
               f"{', '.join(_f(x) for x in e['offline_runs']['pagedllm'])}; vLLM "
               f"{', '.join(_f(x) for x in e['offline_runs']['vLLM'])} (the table: medians)"
               for e in entries if max(len(e["offline_runs"]["pagedllm"]), len(e["offline_runs"]["vLLM"])) > 1]
    lines = ["Offline (every request at once), output tokens/s:", "", *offline_table(entries), "",
             *(repeats + [""] if repeats else []),
             "Served (`pagedllm bench serve`, streaming /v1/completions, all requests at once):", "",
             *served_table(entries), ""]
    ratios = [f"- {e['workload']} {e['dtype']}: served pagedllm / vLLM output tok/s "
              f"{_f(e['ratios']['served pagedllm / vLLM'], '{:.2f}x')}" for e in entries]
    errors = [f"- {e['workload']} {e['dtype']} {name} failed: `{msg}`" for e in entries
              for name, msg in e["errors"].items()]
    loads = [f"- {e['workload']} {e['dtype']}: " + ", ".join(f"{n} {'→'.join(f'{x:.1f}' for x in v)}"
                                                           for n, v in e["loadavg"].items())
             for e in entries if e["loadavg"]]
    if loads:
        loads = ["", "1-minute load average before → after each run (2 cores; other work shares them):", *loads]
    return "\n".join(lines + ratios + ([""] + errors if errors else []) + loads) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--md", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    entries = collect(args.out_dir)
    if not entries:
        print(f"no runs under {args.out_dir}", file=sys.stderr)
        return 1
    text = render_markdown(entries)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"entries": entries}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
