"""Issue 12's target table from A/B result files (rustccl vs gloo, CPU).

    python benchmarks/cpu_targets.py benchmarks/results/2026-11-23-h200x2host-cpu-4rank.jsonl ...

One row per (ranks, op): rustccl/gloo (gloo's time / rustccl's time, > 1:
rustccl faster) over the small sizes (<= 32 KiB, as a range) and at
128 KiB - 32 MiB; bold where a target is missed (>= 10x at <= 32 KiB,
>= 5x at >= 256 KiB); and busbw drops of more than 25% from one size to the
next ("cliffs"). Sizes are the per-rank sizes of the sweep (`size`).
"""

from __future__ import annotations

import json
import sys

COLS = [128 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20]
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "gather", "scatter", "send_recv"]


def load(path: str):
    head, rows = None, {}
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") == "header":
            head = r
        elif r.get("kind") == "result" and "size" in r and "us" in r:
            rows[(r["op"], r["size"], r["backend"])] = r
    return head, rows


def fmt(x: float, target: float) -> str:
    s = f"{x:.1f}"
    return f"**{s}**" if x < target else s


def table(paths: list[str]) -> list[str]:
    out = ["| ranks | op | <= 32 KiB | " + " | ".join(f"{c >> 10} KiB" if c < 1 << 20 else f"{c >> 20} MiB" for c in COLS) + " | cliffs |",
           "|---" * (len(COLS) + 4) + "|"]
    for path in paths:
        head, rows = load(path)
        world = head["world"]
        for op in OPS:
            sizes = sorted({s for (o, s, b) in rows if o == op and b == "rustccl"})
            if not sizes:
                continue
            ratio = {s: rows[(op, s, "gloo")]["us"] / rows[(op, s, "rustccl")]["us"] for s in sizes if (op, s, "gloo") in rows}
            small = [ratio[s] for s in sizes if s <= 32 << 10 and s in ratio]
            lo, hi = min(small), max(small)
            cells = [f"{fmt(lo, 10)}-{hi:.1f}" if lo < 10 else f"{lo:.1f}-{hi:.1f}"]
            # 128 KiB lies between the two targets' ranges: no target
            cells += [(fmt(ratio[c], 5) if c >= 256 << 10 else f"{ratio[c]:.1f}") if c in ratio else "-" for c in COLS]
            bw = [rows[(op, s, "rustccl")]["busbw_GBps"] for s in sizes]
            cliffs = [f"{sizes[i] >> 10}->{sizes[i + 1] >> 10} KiB" for i in range(len(sizes) - 1) if bw[i + 1] < 0.75 * bw[i] and sizes[i] >= 1024]
            out.append(f"| {world} | {op} | " + " | ".join(cells) + f" | {', '.join(cliffs) or '-'} |")
    return out


if __name__ == "__main__":
    print("\n".join(table(sys.argv[1:])))
