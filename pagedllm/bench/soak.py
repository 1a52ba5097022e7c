"""`pagedllm bench soak`: bursts of streams, hang-ups and bad requests against a started server.

After every burst it waits for the server to go idle and records its resident memory, the KV
blocks still in use, the requests still running or waiting, and the client-side errors. It fails
(exit 1) if blocks or requests leak, if anything errs, or if resident memory still grows over the
last five bursts by more than --rss-tolerance-mib.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pagedllm.bench.soak_features import STORE_ARGS
from pagedllm.errors import UserFacingError

DEFAULT_SERVE_ARGS = "--kv-cache-memory 16MiB --max-num-seqs 64"  # 45 blocks of the default model: it preempts
TAIL = 5  # bursts over which memory must have levelled off


@dataclass(slots=True)
class BurstRow:
    burst: int
    rss_mib: float
    blocks_used: int
    running: int
    waiting: int
    preemptions: int
    completed: int
    disconnected: int
    refused: int
    errors: int
    seconds: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model for the started server (default: the built-in one)")
    parser.add_argument("--serve-args", default=DEFAULT_SERVE_ARGS, help="more `pagedllm serve` options, one string")
    parser.add_argument("--bursts", type=int, default=20, help=f"bursts to run (at least {2 * TAIL} for a verdict)")
    parser.add_argument("--streams", type=int, default=64, help="requests per burst (streaming chats by default)")
    parser.add_argument("--mix", choices=("chat", "features"), default="chat",
                        help="the requests: streaming chats, or drawn across the three endpoints and their features "
                             "(n, logprobs, structured outputs, tool calls, beam search, ...), streamed or whole")
    parser.add_argument("--disconnects", type=int, default=16, help="of those, how many hang up mid-stream")
    parser.add_argument("--bad-requests", type=int, default=16, help="invalid requests mixed into each burst")
    parser.add_argument("--max-tokens", type=int, default=64, help="longest completion a stream asks for")
    parser.add_argument("--rss-tolerance-mib", type=float, default=16.0,
                        help=f"most resident memory may grow over the last {TAIL} bursts")
    parser.add_argument("--idle-timeout", type=float, default=120.0, help="seconds to wait for idle after a burst")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="write the rows and the verdict as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH", help="PNG of memory and blocks per burst")
    parser.add_argument("--label", default="this run", help="this run's name in the plot")
    parser.add_argument("--compare", nargs="*", default=[], metavar="JSON",
                        help="earlier runs' --json files to draw beside this one (named by file name)")


def run(args: argparse.Namespace) -> int:
    from pagedllm.bench.serve_launch import launch

    if args.disconnects > args.streams or min(args.bursts, args.streams, args.max_tokens) < 1:
        raise UserFacingError("need --bursts >= 1, --streams >= 1, --max-tokens >= 1 and --disconnects <= --streams")
    serve_args = shlex.split(args.serve_args)
    if args.mix == "features" and "--responses-store-size" not in serve_args:  # stored responses are in the mix
        serve_args += STORE_ARGS
    server = launch(args.model, serve_args)
    try:
        rows = asyncio.run(_soak(server.base_url, server.process.pid, args))
    finally:
        server.stop()
    verdict = judge(rows, args.rss_tolerance_mib)
    _report(rows, verdict, args)
    return 0 if verdict["ok"] else 1


async def _soak(base_url: str, pid: int, args: argparse.Namespace) -> list[BurstRow]:
    import httpx

    from pagedllm.bench.soak_burst import BurstPlan, run_burst

    rng = random.Random(args.seed)
    # idle connections expire here before the server's keep-alive (uvicorn: 5 s, httpx's default expiry too) can close
    # them: else a burst could send a request on a connection the server was closing at that moment (a ReadError)
    limits = httpx.Limits(max_connections=args.streams + args.bad_requests + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        pool = scrape((await client.get("/metrics")).text)["pagedllm_kv_blocks_total"]
        print(f"soaking {model} at {base_url}: a pool of {int(pool)} KV blocks", file=sys.stderr)
        plan = BurstPlan(args.streams, args.disconnects, args.bad_requests, args.max_tokens, model, args.mix)
        rows, preempted = [], 0
        for burst in range(1, args.bursts + 1):
            start = time.monotonic()
            result = await run_burst(client, plan, rng)
            metrics = await _wait_idle(client, args.idle_timeout)
            gauges = [int(metrics[name]) for name in LEFT_BEHIND]
            total = int(metrics["pagedllm_num_preemptions_total"])
            rows.append(BurstRow(burst, rss_mib(pid), *gauges, total - preempted, result.completed,
                                 result.disconnected, result.refused, len(result.errors),
                                 round(time.monotonic() - start, 2)))
            preempted = total
            for error in result.errors[:5]:
                print(f"burst {burst}: {error}", file=sys.stderr)
            print(_row_text(rows[-1]), file=sys.stderr)
    return rows


LEFT_BEHIND = ("pagedllm_kv_blocks_used", "pagedllm_num_requests_running", "pagedllm_num_requests_waiting")


async def _wait_idle(client, timeout: float) -> dict[str, float]:
    """The server's metrics once nothing is left behind, or as last seen when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape((await client.get("/metrics")).text)
        if all(metrics[name] == 0 for name in LEFT_BEHIND) or time.monotonic() > deadline:
            return metrics
        await asyncio.sleep(0.2)


def scrape(metrics_text: str) -> dict[str, float]:
    """Sample values by metric name (this server labels every series with model_name only)."""
    values = {}
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            values[line.split("{", 1)[0].split(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return values


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise UserFacingError(f"no VmRSS for process {pid}")


def judge(rows: list[BurstRow], tolerance_mib: float) -> dict:
    """Leaks, errors and late memory growth; a verdict needs at least 2 * TAIL bursts."""
    leaks = [r.burst for r in rows if (r.blocks_used, r.running, r.waiting) != (0, 0, 0)]
    errors = sum(r.errors for r in rows)
    tail = [r.rss_mib for r in rows[-TAIL:]]
    growth = round(tail[-1] - tail[0], 1)
    enough = len(rows) >= 2 * TAIL
    ok = not leaks and errors == 0 and growth <= tolerance_mib and enough
    return {"ok": ok, "bursts_with_leaks": leaks, "errors": errors, "rss_growth_last_bursts_mib": growth,
            "tail": TAIL, "rss_tolerance_mib": tolerance_mib, "enough_bursts": enough,
            "rss_first_mib": rows[0].rss_mib, "rss_last_mib": rows[-1].rss_mib}


def _row_text(row: BurstRow) -> str:
    return (f"burst {row.burst:2d}: rss {row.rss_mib:7.1f} MiB, blocks used {row.blocks_used}, running "
            f"{row.running}, waiting {row.waiting}, preemptions {row.preemptions}, completed {row.completed}, "
            f"hung up {row.disconnected}, "
            f"refused {row.refused}, errors {row.errors}, {row.seconds:.1f} s")


def _report(rows: list[BurstRow], verdict: dict, args: argparse.Namespace) -> None:
    print(json.dumps(verdict, indent=1))
    if args.json:
        report = {"command": "pagedllm bench soak " + " ".join(shlex.quote(a) for a in sys.argv[3:]),
                  "rows": [asdict(r) for r in rows], "verdict": verdict}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        runs = {Path(p).stem: json.loads(Path(p).read_text())["rows"] for p in args.compare}
        plot_soak({**runs, args.label: [asdict(r) for r in rows]}, args.plot)


def plot_soak(runs: dict[str, list[dict]], path: str) -> None:
    """Resident memory per burst of each run (label -> rows as written to --json), the tail shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for label, rows in runs.items():
        left = sum(r["blocks_used"] + r["running"] + r["waiting"] for r in rows)
        ax.plot([r["burst"] for r in rows], [r["rss_mib"] for r in rows], marker="o", markersize=3,
                label=f"{label} (left behind: {left})")
    last = max(len(rows) for rows in runs.values())
    ax.axvspan(last - TAIL + 0.5, last + 0.5, color="0.92")
    ax.set_xlabel(f"burst (shaded: the last {TAIL})")
    ax.set_ylabel("server resident memory (MiB)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("pagedllm bench soak: memory after each burst, blocks and requests left behind")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
