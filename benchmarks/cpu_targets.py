"""Issue 12's target table from A/B result files (rustccl vs gloo, CPU).

    python benchmarks/cpu_targets.py benchmarks/results/2026-11-23-h200x2host-cpu-4rank.jsonl.gz ...

One row per (ranks, op): rustccl/gloo (gloo's time / rustccl's time, > 1:
rustccl faster) over the small sizes (<= 32 KiB, as a range) and at
128 KiB - 32 MiB; bold where a target is missed (>= 10x at <= 32 KiB,
>= 5x at >= 256 KiB); and busbw drops of more than 25% from one size to the
next ("cliffs"). Sizes are the per-rank sizes of the sweep (`size`).

A missed cell says in brackets how far any backend could go there, from
figures of the same run:

* <= 32 KiB, ``(torch <= Nx)``: gloo's time over the ``floor`` row's (the
  same call on a group of torch's ``fake`` backend, which does nothing): a
  backend that cost nothing beyond torch's own call would reach N;
* from 256 KiB, ``(mem <= Nx)``: gloo's time over the memory floor: the
  bytes every rank must read and write (``metrics.memory_traffic``; for
  send_recv, whose pairs all send at once, each message copied once) at the
  host's copy speed measured in the run (header ``host_copy``). A bound
  where the tensors stream through memory; where they fit in the
  last-level cache (``metrics.footprint`` < 2x ``llc``) caches may beat
  it, and the bracket says ``in cache``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys

# The bench's formulas (a module without imports), without importing the
# package (which needs torch and the built extension).
_spec = importlib.util.spec_from_file_location(
    "rustccl_bench_metrics", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "rustccl", "bench", "metrics.py"))
metrics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(metrics)

COLS = [128 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20]
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "gather", "scatter", "send_recv"]


def load(path: str):
    """The header and rows of one sweep's JSONL, gzipped (`.gz`, as
    committed) or not; `X.jsonl` that is committed as `X.jsonl.gz` is read
    from there (the results' READMEs name the files before they were
    gzipped)."""
    head, rows = None, {}
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path)):
        r = json.loads(line)
        if r.get("kind") == "header":
            head = r
        elif r.get("kind") == "result" and "size" in r and "us" in r:
            rows[(r["op"], r["size"], r["backend"])] = r
        elif r.get("kind") == "floor" and "size" in r:
            rows[(r["op"], r["size"], "floor")] = r
    return head, rows


def ceiling(head: dict, rows: dict, op: str, size: int) -> str:
    """" (torch <= Nx)" or " (mem <= Nx)": see the module docs; "" if unknown."""
    gloo = rows.get((op, size, "gloo"))
    if gloo is None:
        return ""
    if size <= 32 << 10:
        floor = rows.get((op, size, "floor"))
        return f" (torch <= {gloo['us'] / floor['us']:.0f}x)" if floor and floor["us"] > 0 else ""
    hosts = head.get("host_copy") or {}
    hc = next(iter(hosts.values()), None) if len(hosts) == 1 else None
    world = head["world"]
    # send_recv: the bench's pairs all send at once, each byte copied once.
    traffic = 2 * (world // 2) * gloo["bytes"] if op == "send_recv" else metrics.memory_traffic(op, gloo["bytes"], world)
    if not hc or not hc.get("GBps") or traffic is None:
        return ""
    floor_us = traffic / (2 * hc["GBps"] * 1e9) * 1e6
    # the bound assumes the tensors stream through memory: say where they fit the cache
    cached = "; in cache" if hc.get("llc") and metrics.footprint(op, gloo["bytes"], world) < 2 * hc["llc"] else ""
    return f" (mem <= {gloo['us'] / floor_us:.1f}x{cached})"


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
            if small:
                lo, hi = min(small), max(small)
                worst = min((s for s in sizes if s <= 32 << 10 and s in ratio), key=lambda s: ratio[s])
                cells = [f"{fmt(lo, 10)}-{hi:.1f}{ceiling(head, rows, op, worst)}" if lo < 10 else f"{lo:.1f}-{hi:.1f}"]
            else:  # a sweep that starts above 32 KiB
                cells = ["-"]
            # 128 KiB lies between the two targets' ranges: no target
            cells += [
                (fmt(ratio[c], 5) + (ceiling(head, rows, op, c) if ratio[c] < 5 else "") if c >= 256 << 10 else f"{ratio[c]:.1f}") if c in ratio else "-"
                for c in COLS
            ]
            bw = [rows[(op, s, "rustccl")]["busbw_GBps"] for s in sizes]
            cliffs = [f"{sizes[i] >> 10}->{sizes[i + 1] >> 10} KiB" for i in range(len(sizes) - 1) if bw[i + 1] < 0.75 * bw[i] and sizes[i] >= 1024]
            out.append(f"| {world} | {op} | " + " | ".join(cells) + f" | {', '.join(cliffs) or '-'} |")
    return out


if __name__ == "__main__":
    print("\n".join(table(sys.argv[1:])))
