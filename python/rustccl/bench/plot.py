"""The PNG: busbw vs size and latency (us per call) vs size, log-log.

One figure, two panels side by side; one line per (backend, op): the colour
names the op, the line style the backend (first backend solid, the others
dashed / dotted), so "rustccl all_reduce" and "gloo all_reduce" sit next to
each other in the same colour (legend below the panels). The x axis is the
``bytes`` field (all_gather: the gathered output), as in the tables. DDP
steps are in the title.
Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]


def _size_formatter():
    from matplotlib.ticker import FuncFormatter

    from .metrics import human_bytes

    return FuncFormatter(lambda x, _pos: human_bytes(int(x)) if x >= 1 else "")


def plot(path: str, header: dict, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends, ops_ = header["options"]["backends"], header["options"]["ops"]
    res = [r for r in rows if r.get("kind") == "result"]
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(14, 6.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for oi, op in enumerate(ops_):
        for bi, b in enumerate(backends):
            pts = sorted((r["bytes"], r["busbw_GBps"], r["us"]) for r in res if r["op"] == op and r["backend"] == b)
            if not pts:
                continue
            x = [p[0] for p in pts]
            kw = dict(color=colors[oi % len(colors)], linestyle=STYLES[bi % len(STYLES)],
                      marker=MARKERS[bi % len(MARKERS)], markersize=3.5, label=f"{b} {op}")
            ax_bw.plot(x, [p[1] for p in pts], **kw)
            ax_t.plot(x, [p[2] for p in pts], **kw)
    for ax, ylabel, title in ((ax_bw, "busbw (GB/s)", "bus bandwidth"), (ax_t, "time per call (us)", "latency")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(_size_formatter())
        ax.set_xlabel("bytes")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", alpha=0.12)
        ax.tick_params(axis="x", labelrotation=45)
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6) or 1, fontsize=8, frameon=False)
    ddp = {r["backend"]: r["ms"] for r in res if r["op"] == "ddp_toy_step"}
    title = (f"{header['machine']}: {header['device']}, {header['world']} ranks, {header['options']['dtype']}, "
             f"{' vs '.join(backends)}")
    if ddp:
        title += "\nDDP toy step: " + ", ".join(f"{b} {ms:.1f} ms" for b, ms in ddp.items())
    fig.suptitle(title, fontsize=10)
    n_rows = -(-len(labels) // 6) if labels else 0
    fig.tight_layout(rect=(0, 0.035 * n_rows + 0.01, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``python -m rustccl.bench.plot RUN.jsonl[.gz] [OUT.png]``: redraws a run's
    PNG from its JSONL (header line and result rows), beside it by default.
    The committed results keep only the JSONL, gzipped (``RUN.jsonl.gz``),
    and the table."""
    import gzip
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2:
        print("usage: python -m rustccl.bench.plot RUN.jsonl[.gz] [OUT.png]", file=sys.stderr)
        return 2
    with gzip.open(args[0], "rt") if args[0].endswith(".gz") else open(args[0]) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    header = next((r for r in lines if r.get("kind") == "header"), None)
    if header is None:
        print(f"rustccl.bench.plot: {args[0]} has no header line", file=sys.stderr)
        return 1
    out = args[1] if len(args) == 2 else args[0].removesuffix(".gz").removesuffix(".jsonl") + ".png"
    plot(out, header, lines)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
