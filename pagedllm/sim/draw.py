"""Pictures of the simulation: a memory map at one step, and the policies side by side.

The memory map is drawn like the PagedAttention paper's diagrams: the pool as rows of slots (a grid
of blocks for paged policies, one wrapped strip for contiguous ones), each request in its own
colour, empty slots a request holds hatched (// it will still fill them, xx it never will), free
space blank, and beside it each request's block table (or slot range).

matplotlib and numpy are imported inside the drawing functions only: the simulator runs without them.
"""

from dataclasses import dataclass
from pathlib import Path

from pagedllm.sim.accounting import split_slack
from pagedllm.sim.memory_map import MapEntry, MemoryMap
from pagedllm.sim.result import SimResult

MAX_LISTED = 36  # block-table lines beside the map
FREE_RGB = (1.0, 1.0, 1.0)
CACHED_RGB = (0.86, 0.86, 0.86)
SHARED_RGB = (0.25, 0.25, 0.32)
EXTERNAL_RGB = (1.0, 0.80, 0.80)
BEYOND_RGB = (0.6, 0.6, 0.6)  # the last row's cells past the end of the pool


@dataclass(slots=True)
class _Span:
    """Slots [start, start + n) of one request in one state: 'tok', 'res' or 'int'."""

    start: int
    n: int
    state: str
    owner: int


def _spans(entry: MapEntry, owner: int, block_size: int | None) -> list[_Span]:
    reserve, internal = split_slack(entry.used, entry.capacity, entry.final_len)
    parts = [("tok", entry.used), ("res", reserve), ("int", internal)]
    if block_size is None:
        out, pos = [], entry.start or 0
        for state, n in parts:
            out.append(_Span(pos, n, state, owner))
            pos += n
        return [s for s in out if s.n]
    out, logical = [], 0
    for state, n in parts:  # walk logical slots, mapping each block-sized piece through the table
        while n > 0:
            block, off = divmod(logical, block_size)
            take = min(n, block_size - off)
            out.append(_Span(entry.blocks[block] * block_size + off, take, state, owner))
            logical, n = logical + take, n - take
    return out


def _row_width(pool: int, block_size: int | None) -> int:
    width = 1
    while width * width < 2 * pool:
        width *= 2
    b = block_size or 1
    return max(b, -(-width // b) * b)


def _colour(i: int) -> tuple[float, float, float]:
    """Ten strong colours first, then their light partners: neighbours in the list differ clearly."""
    import matplotlib

    k = i % 20
    return matplotlib.colormaps["tab20"](2 * k if k < 10 else 2 * (k - 10) + 1)[:3]


def _text_colour(i: int) -> tuple[float, float, float]:
    return tuple(0.75 * c for c in _colour(i))  # type: ignore[return-value]


def _shared_blocks(mm: MemoryMap) -> set[int]:
    seen: set[int] = set()
    shared: set[int] = set()
    for e in mm.entries:
        for b in e.blocks:
            (shared if b in seen else seen).add(b)
    return shared


def _paint(mm: MemoryMap, width: int):
    """An RGB image of the pool, one pixel per slot, and the hatched spans to overlay."""
    import numpy as np

    rows = -(-mm.pool_slots // width)
    img = np.ones((rows * width, 3))
    img[mm.pool_slots:] = BEYOND_RGB
    for start, n in mm.free_runs:
        if mm.next_need is not None and n < mm.next_need:
            img[start:start + n] = EXTERNAL_RGB
    b = mm.block_size or 1
    for blk in mm.cached_blocks:
        img[blk * b:(blk + 1) * b] = CACHED_RGB
    hatched = []
    for i, entry in enumerate(mm.entries):
        rgb = np.array(_colour(i))
        for span in _spans(entry, i, mm.block_size):
            tint = rgb if span.state == "tok" else 0.55 * rgb + 0.45
            img[span.start:span.start + span.n] = tint
            if span.state != "tok":
                hatched.append(span)
    for blk in _shared_blocks(mm):
        img[blk * b:(blk + 1) * b] = SHARED_RGB
    return img.reshape(rows, width, 3), hatched


def _hatch(ax, spans: list[_Span], width: int) -> None:
    from matplotlib.patches import Rectangle

    for span in spans:
        pos, end = span.start, span.start + span.n
        while pos < end:  # a span may wrap over several rows
            row, col = divmod(pos, width)
            n = min(end - pos, width - col)
            ax.add_patch(Rectangle((col - 0.5, row - 0.5), n, 1, fill=False, lw=0,
                                   hatch="////" if span.state == "res" else "xxxx", edgecolor=(0, 0, 0, 0.45)))
            pos += n


def _grid(ax, mm: MemoryMap, width: int, rows: int) -> None:
    b = mm.block_size
    ax.hlines([r - 0.5 for r in range(rows + 1)], -0.5, width - 0.5, colors="0.6", lw=0.4)
    if b is not None and width // b <= 64:
        ax.vlines([c - 0.5 for c in range(0, width + 1, b)], -0.5, rows - 0.5, colors="0.6", lw=0.4)
    step = max(1, rows // 16)
    ax.set_yticks(range(0, rows, step))
    unit, per_row = ("block", width // b) if b else ("slot", width)
    ax.set_yticklabels([str(r * per_row) for r in range(0, rows, step)], fontsize=7)
    ax.set_ylabel(f"first {unit} of the row")
    ax.set_xticks([])


def _table_lines(mm: MemoryMap) -> list[tuple[str, int]]:
    lines = []
    for i, e in enumerate(mm.entries[:MAX_LISTED]):
        final = "?" if e.final_len is None else e.final_len
        if mm.block_size is None:
            where = f"slots {e.start}-{(e.start or 0) + e.capacity - 1}"
        else:
            shown = ", ".join(map(str, e.blocks[:8])) + (f", ... ({len(e.blocks)})" if len(e.blocks) > 8 else "")
            where = f"[{shown}]"
        lines.append((f"{e.label:>6} {e.used:>4}/{final:<4} {where}", i))
    if len(mm.entries) > MAX_LISTED:
        lines.append((f"... and {len(mm.entries) - MAX_LISTED} more requests", -1))
    return lines


def _legend(ax, mm: MemoryMap) -> None:
    from matplotlib.patches import Patch

    items = [Patch(facecolor=_colour(0), label="tokens (one colour per request)"),
             Patch(facecolor="white", hatch="////", edgecolor="0.4", label="held, will be filled (reservation)"),
             Patch(facecolor="white", hatch="xxxx", edgecolor="0.4", label="held, never filled (internal)"),
             Patch(facecolor=FREE_RGB, edgecolor="0.6", label="free")]
    if mm.block_size is None:
        items.append(Patch(facecolor=EXTERNAL_RGB, label="free but too short for the next request (external)"))
    if mm.cached_blocks:
        items.append(Patch(facecolor=CACHED_RGB, label="free, cached prefix"))
    if _shared_blocks(mm):
        items.append(Patch(facecolor=SHARED_RGB, label="shared prefix block"))
    ax.legend(handles=items, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, fontsize=8, frameon=False)


def _title(mm: MemoryMap) -> str:
    kind = "contiguous" if mm.block_size is None else f"block size {mm.block_size}"
    text = f"{mm.policy} ({kind}), step {mm.step}: {len(mm.entries)} requests in {mm.pool_slots} slots"
    if mm.report is not None:
        r = mm.report
        text += (f"\ntokens {r.pct(r.tokens):.1f}%  reservation {r.pct(r.reservation):.1f}%  "
                 f"internal {r.pct(r.internal):.1f}%  external {r.pct(r.external):.1f}%  free {r.pct(r.free):.1f}%")
    return text


def draw_memory_map(mm: MemoryMap, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = _row_width(mm.pool_slots, mm.block_size)
    img, hatched = _paint(mm, width)
    rows = img.shape[0]
    fig = plt.figure(figsize=(15, max(5.0, min(12.0, 3 + rows * 0.09))))
    ax = fig.add_axes((0.05, 0.14, 0.55, 0.74))
    ax.imshow(img, aspect="auto", interpolation="nearest")
    _hatch(ax, hatched, width)
    _grid(ax, mm, width, rows)
    _legend(ax, mm)
    side = fig.add_axes((0.62, 0.14, 0.37, 0.74))
    side.axis("off")
    side.set_title("request  tokens/final  " + ("slot range" if mm.block_size is None else "block table"),
                   fontsize=9, loc="left")
    lines = _table_lines(mm)
    for k, (text, i) in enumerate(lines):
        side.text(0, 1 - (k + 0.5) / max(len(lines), 24), text, fontsize=8, family="monospace",
                  color=_text_colour(i) if i >= 0 else "0.3", va="center", transform=side.transAxes)
    fig.suptitle(_title(mm), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(values: list[float]) -> list[float]:
    """Trailing moving average over about 1% of the run."""
    window = max(1, len(values) // 100)
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v - (values[i - window] if i >= window else 0.0)
        out.append(acc / min(i + 1, window))
    return out


def plot_results(result: SimResult, path: str | Path) -> None:
    """Left: where the pool goes, mean over busy steps, per policy. Right: token occupancy over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.policies)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1, 1.3]})
    bottom = [0.0] * len(names)
    cats = (("tokens", "tokens", "tab:blue"), ("reservation", "reservation", "tab:orange"),
            ("internal", "internal frag.", "tab:red"), ("external", "external frag.", "tab:purple"))
    for key, label, colour in cats:
        vals = [result.policies[n].mean_pct(key) for n in names]
        left.barh(names, vals, left=bottom, color=colour, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for y, n in enumerate(names):
        left.text(101, y, f"{result.policies[n].mean_running:.0f} req", va="center", fontsize=8)
    left.set_xlim(0, 115)
    left.invert_yaxis()
    left.set_xlabel("% of pool, mean over busy steps (text: mean concurrent requests)")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, frameon=False)
    for n in names:
        right.plot(_smooth([100 * u for u in result.policies[n].utilization]), label=n, lw=1.2)
    right.set_xlabel("busy step (idle steps skipped)")
    right.set_ylabel("slots holding tokens, % of pool (moving average)")
    right.set_ylim(0, 100)
    right.legend(fontsize=8, ncol=2)
    fig.suptitle(f"{result.num_requests} requests, pool of {result.config.pool_slots} slots", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
