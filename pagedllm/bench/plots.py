"""PNG plots of benchmark results (matplotlib, headless)."""

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_kv_timeline(report: dict, path: str | Path) -> None:
    """KV blocks in use after each engine step, one line per engine run."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in report["runs"]:
        timeline = run.get("kv_timeline")
        if timeline:
            ax.plot(timeline["time_s"], timeline["blocks_used"], label=run["label"], linewidth=1.2)
    first = next((r for r in report["runs"] if r.get("num_blocks")), None)
    if first:
        ax.axhline(first["num_blocks"], color="grey", linestyle="--", linewidth=0.8, label="pool size")
    ax.set(xlabel="seconds since submission", ylabel="KV blocks in use",
           title=f"KV usage over time: {report['workload']['name']}, {report['model']}")  # fmt: skip
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)


def plot_sweep(report: dict, path: str | Path) -> None:
    """Output tokens/s (left axis) and KV waste (right axis) against the swept parameter."""
    plt = _pyplot()
    points = report["points"]
    xs = [p["value"] for p in points]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(xs, [p["output_tokens_per_s"] for p in points], "o-", color="tab:blue", label="output tokens/s")
    ax.set_xlabel(report["parameter"])
    ax.set_ylabel("output tokens/s", color="tab:blue")
    if report["parameter"] == "block_size":
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    waste = ax.twinx()
    waste.plot(xs, [100 * p["mean_kv_waste"] for p in points], "s--", color="tab:red", label="KV waste")
    waste.set_ylabel("empty tail slots / used slots (%)", color="tab:red")
    ax.set_title(f"{report['parameter']} sweep: {report['workload']['name']}, {report['model']}")
    ax.grid(alpha=0.3)
    _save(fig, path)


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def plot_latency_percentiles(reports: list[dict], path: str | Path) -> None:
    """p50 / p90 / p99 of TTFT, TPOT, ITL and end-to-end latency, one group of bars per serve report."""
    plt = _pyplot()
    metrics = [("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "end to end")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(12, 3.8))
    width = 0.8 / max(len(reports), 1)
    for ax, (key, title) in zip(axes, metrics):
        for i, report in enumerate(reports):
            summary = report["metrics"][key] or {}
            values = [1000 * (summary.get(q) or 0.0) for q in ("p50", "p90", "p99")]
            ax.bar([x + i * width for x in range(3)], values, width, label=report.get("engine", f"run {i}"))
        ax.set_xticks([x + width * (len(reports) - 1) / 2 for x in range(3)], ["p50", "p90", "p99"])
        ax.set(title=title, ylabel="ms")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"serving latency: {reports[0]['workload']['name']}")
    _save(fig, path)
