"""Reporting: ratios, JSON lines and the markdown table.

JSONL layout (one object per line, field ``kind`` tells them apart):

* ``header`` (first line): machine label, host, CPU/GPU, cores, memory,
  torch / rustccl / NCCL versions, rustccl settings, the command line and
  every option of the run.
* ``result``: one per (backend, op, size) with the anchors' fields
  ``backend device world op dtype bytes us algbw_GBps busbw_GBps`` plus
  ``size`` (the swept per-rank size), ``count``, ``us_slowest_rank``,
  ``iters``, ``warmup``, and the results schema's fields (``schema.FIELDS``:
  ``peer``, ``load``, ``mode``, ``us_min``, ``us_max``, ``host``, ``commit``,
  ``machine``); DDP rows have op ``ddp_toy_step``, ``ms``, ``ms_max``,
  ``batch``, ``model_size``, ``steps``.
* ``floor`` (CPU, points up to 64 KiB, not all_gather): the same call on a group of torch's
  fake backend, timed in the same alternation: ``op size bytes us``, torch's
  own cost per call (Python, dispatch, work objects), below which no
  backend's ``us`` can go.
* ``error``: a (backend, op) block that raised, with the message.
* ``ratio``: per (op, size) and other backend: ``ratio = t_other / t_ref``
  where ref is the first of ``--backends`` (rustccl): > 1 means rustccl is
  faster; for the sweep ops this equals busbw_ref / busbw_other.
"""

from __future__ import annotations

import json

from . import schema
from .metrics import DEFAULT_ITERS, SMALL_BYTES, SMALL_MIN_ITERS, human_bytes


STEPS = ("ddp_toy_step", "pp_step")


def _time(row: dict) -> float:
    return row["ms"] * 1e3 if row["op"] in STEPS else row["us"]


def ratios(rows: list[dict], backends: list[str]) -> list[dict]:
    """Ratio records of backends[0] against every other backend."""
    ref, others = backends[0], backends[1:]
    by_key = {(r["backend"], r["op"], r.get("size")): r for r in rows if r.get("kind") == "result"}
    out = []
    for (b, op, size), r in by_key.items():
        if b != ref:
            continue
        for o in others:
            q = by_key.get((o, op, size))
            if q is None:
                continue
            rec = {"kind": "ratio", "op": op, "backend": ref, "vs": o, "ratio": _time(q) / _time(r)}
            # The spread: the ratio within each round (both timed in it).
            rr, qr = r.get("us_rounds"), q.get("us_rounds")
            if rr and qr and len(rr) == len(qr):
                each = [b_ / a_ for a_, b_ in zip(rr, qr) if a_ > 0]
                if each:
                    rec.update(ratio_min=min(each), ratio_max=max(each))
            if op in STEPS:
                rec.update(ms=r["ms"], ms_vs=q["ms"])
            else:
                rec.update(size=size, bytes=r["bytes"], us=r["us"], us_vs=q["us"])
            out.append(rec)
    return out


def write_jsonl(path: str, header: dict, rows: list[dict], ratio_rows: list[dict]) -> None:
    machine = header.get("machine")
    rows = schema.stamp(rows, backends=header["options"]["backends"], machine=machine, commit=header.get("rustccl_git"),
                        load=header["options"].get("load", 0))
    with open(path, "w") as f:
        f.write(json.dumps(dict(header, host_fingerprint=schema.host_fingerprint())) + "\n")
        for r in rows + ratio_rows:
            f.write(json.dumps(dict(r, machine=machine)) + "\n")


def _fmt_us(v: float) -> str:
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def _fmt_bw(v: float) -> str:
    return f"{v:.3g}"


def _ratio_cell(x: float | None, rec: dict | None = None) -> str:
    """A ratio, with the lowest and highest of its rounds where known."""
    if x is None:
        return ""
    if rec is not None and "ratio_min" in rec:
        return f"{x:.2f} ({rec['ratio_min']:.2f}-{rec['ratio_max']:.2f})"
    return f"{x:.2f}"


def op_table(op: str, rows: list[dict], ratio_rows: list[dict], backends: list[str]) -> list[str]:
    """Markdown lines of one op: us and busbw per backend, ratios per size."""
    res = [r for r in rows if r.get("kind") == "result" and r["op"] == op]
    ref = backends[0]
    sizes_ = sorted({r["size"] for r in res})
    cell = {(r["backend"], r["size"]): r for r in res}
    rat = {(q["vs"], q["size"]): q["ratio"] for q in ratio_rows if q["op"] == op}
    floor = {r["size"]: r["us"] for r in rows if r.get("kind") == "floor" and r["op"] == op}
    head = ["bytes"]
    for b in backends:
        head += [f"{b} us", f"{b} busbw GB/s"]
    frac = any("busbw_frac" in r for r in res)
    head += [f"{ref}/{o}" for o in backends[1:]] + ([f"{ref} busbw / copy"] if frac else [])
    if floor:
        head += ["torch floor us"] + [f"{o}/floor" for o in backends[1:]]
    mem = {r["size"]: r["mem_floor_us"] for r in res if "mem_floor_us" in r}
    if mem:
        head += ["memory floor us"] + [f"{o}/memory floor" for o in backends[1:]]
    algs = any("algorithms" in r for r in res if r["backend"] == ref)
    if algs:
        head.append(f"{ref} algorithm")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in sizes_:
        any_row = next(cell[(b, s)] for b in backends if (b, s) in cell)
        line = [human_bytes(any_row["bytes"])]
        for b in backends:
            r = cell.get((b, s))
            line += [_fmt_us(r["us"]), _fmt_bw(r["busbw_GBps"])] if r else ["-", "-"]
        line += [_ratio_cell(rat.get((o, s))) for o in backends[1:]]
        if frac:
            f = (cell.get((ref, s)) or {}).get("busbw_frac")
            line.append("" if f is None else f"{f:.0%}")
        for fl in (f.get(s) for f in (floor, mem) if f):
            # a floor's time, then each other backend's time over it
            line.append("" if fl is None else _fmt_us(fl))
            line += [_ratio_cell(cell[(o, s)]["us"] / fl if (o, s) in cell and fl else None) for o in backends[1:]]
        if algs:
            ran = (cell.get((ref, s)) or {}).get("algorithms") or {}
            # the most calls first (send_recv: both ways of the ping-pong)
            line.append(", ".join(sorted(ran, key=lambda a: (-ran[a], a))))
        lines.append("| " + " | ".join(line) + " |")
    return lines


def summary_table(rows: list[dict], ratio_rows: list[dict], ops_: list[str], backends: list[str]) -> list[str]:
    """Ratios per op at four sizes across the sweep (and the DDP step)."""
    ref = backends[0]
    sizes_ = sorted({r["size"] for r in rows if r.get("kind") == "result" and "size" in r})
    if not sizes_ or len(backends) < 2:
        return []
    picks = sorted({sizes_[0], sizes_[len(sizes_) // 3], sizes_[2 * len(sizes_) // 3], sizes_[-1]})
    lines = []
    for o in backends[1:]:
        rat = {(q["op"], q.get("size")): q for q in ratio_rows if q["vs"] == o}
        head = [f"{ref}/{o} (min-max of rounds)"] + [f"{human_bytes(s)}/rank" for s in picks]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for op in ops_:
            cells = [_ratio_cell(rat[(op, s)]["ratio"], rat[(op, s)]) if (op, s) in rat else "" for s in picks]
            lines.append("| " + " | ".join([op] + cells) + " |")
        lines.append("")
    return lines


def ddp_table(rows: list[dict], ratio_rows: list[dict], backends: list[str]) -> list[str]:
    res = {r["backend"]: r for r in rows if r.get("kind") == "result" and r["op"] == "ddp_toy_step"}
    if not res:
        return []
    any_row = next(iter(res.values()))
    lines = [f"DDP toy step (3x Linear({any_row['model_size']}, {any_row['model_size']}), batch {any_row['batch']}"
             f" per rank, {any_row['steps']} timed steps):", "",
             "| backend X | ms/step | slowest rank ms | " + f"{backends[0]}/X |", "|---|---|---|---|"]
    rat = {q["vs"]: q["ratio"] for q in ratio_rows if q["op"] == "ddp_toy_step"}
    for b in backends:
        r = res.get(b)
        if r:
            ratio = rat.get(b, 1.0 if b == backends[0] else None)
            lines.append(f"| {b} | {r['ms']:.1f} | {r['ms_max']:.1f} | {_ratio_cell(ratio)} |")
    return lines


def pp_table(rows: list[dict], ratio_rows: list[dict], backends: list[str]) -> list[str]:
    res = {r["backend"]: r for r in rows if r.get("kind") == "result" and r["op"] == "pp_step"}
    if not res:
        return []
    a = next(iter(res.values()))
    lines = ["", f"Pipeline step ({a['stages']} stages, {a['micro']} micro-batches of {human_bytes(a['bytes'])} "
             f"forward and back, send/recv only, {a['steps']} timed steps):", "",
             "| backend X | ms/step | slowest rank ms | " + f"{backends[0]}/X |", "|---|---|---|---|"]
    rat = {q["vs"]: q["ratio"] for q in ratio_rows if q["op"] == "pp_step"}
    for b in backends:
        r = res.get(b)
        if r:
            ratio = rat.get(b, 1.0 if b == backends[0] else None)
            lines.append(f"| {b} | {r['ms']:.2f} | {r['ms_max']:.2f} | {_ratio_cell(ratio)} |")
    return lines


def markdown(header: dict, rows: list[dict], ratio_rows: list[dict], mismatches: list[str],
             errors: list[str] = ()) -> str:
    """The whole readable report (also printed to stdout at the end)."""
    backends, ops_ = header["options"]["backends"], header["options"]["ops"]
    ref = backends[0]
    h = header
    out = [f"# rustccl bench: {h['machine']}, {h['device']}, {h['world']} ranks, {h['options']['dtype']}", "",
           f"- started {h['date']}, took {h.get('elapsed_s')} s; host: {h['host']}; {h['hardware']}",
           f"- load average (1/5/15 min, this run's ranks included): {h.get('loadavg_start')} at start, "
           f"{h.get('loadavg_end')} at end",
           f"- torch {h['torch']}, rustccl {h['rustccl']}" + (f", NCCL {h['nccl']}" if h.get("nccl") else ""),
           f"- command: `{h['command']}`"]
    if h["options"].get("load"):
        out.append(f"- load: {h['options']['load']} busy process(es) per core beside the ranks for the whole run; "
                   "`load_rate` in the JSONL rows: their iterations per second while each backend ran")
    if h["options"].get("ddp_threads"):
        out.append(f"- DDP step with {h['options']['ddp_threads']} intra-op threads per rank")
    if "huge_pages" in h:  # headers of runs before 2026-11-29 lack it
        thp = h["huge_pages"]
        out.append(f"- huge pages: THP_MEM_ALLOC_ENABLE={thp.get('THP_MEM_ALLOC_ENABLE')} (torch's own setting), "
                   f"host mode {thp.get('host_mode')}")
    out += [
        f"- iters {h['options']['iters'] or f'{DEFAULT_ITERS} (CPU: {SMALL_MIN_ITERS} up to {human_bytes(SMALL_BYTES)})'}, "
        f"warmup {h['options']['warmup']} "
        f"(CPU: fewer for very large sizes, see `iters` per JSONL row)" + (f", median of {h['options']['repeats']} timed loops"
                                         if h['options'].get('repeats', 1) > 1 else "")
        + "; us = time per call on rank 0; busbw as nccl-tests",
        f"- {ref}/X = X time / {ref} time = {ref} busbw / X busbw: > 1 means {ref} is faster",
        *(f"- {b}: a rustccl group with its own settings " + ", ".join(f"{k}={v}" for k, v in kv.items())
          for b, kv in (h["options"].get("variants") or {}).items()),
        "- method: " + ("A/B (every backend's group in one process, timed alternately, median of rounds)"
                        if h.get("method", "ab") == "ab" else "blocks (one backend's group at a time)")]
    if any(r.get("kind") == "floor" for r in rows):
        out.append("- torch floor us: the same call on torch's fake backend (returns at once, moves nothing), "
                   "timed in the same alternation: torch's own cost per call; X/floor: the ratio to X of a "
                   "backend that took no time")
    if h.get("copy_GBps"):
        out.append("- copy bandwidth (Tensor.copy_ of 64 MiB, one thread per rank, all ranks of a host at once), "
                   "GB/s per rank: " + ", ".join(f"{k} {v:g}" for k, v in h["copy_GBps"].items()))
    for host, hc in (h.get("host_copy") or {}).items():
        llc = hc.get("llc")
        out.append(f"- memory ({host}): all ranks copying at once with {hc['threads']} thread(s) each move "
                   f"{hc['GBps']:g} GB/s (each byte read and written once); last-level cache "
                   + (human_bytes(llc) if llc else "unknown"))
    if any("mem_floor_us" in r for r in rows):
        out.append("- memory floor us: the bytes any backend must read and write in memory for the call "
                   "(each byte that reaches another rank copied once, each reduction input read once) at that "
                   "speed; only where the tensors are at least twice the last-level cache. X/memory floor: "
                   "the ratio to X of a backend that moved no byte more than it must")
    out.append("")
    summary = summary_table(rows, ratio_rows, ops_, backends)
    if summary:
        out += ["## Summary", ""] + summary
    for op in ops_:
        if any(r.get("kind") == "result" and r["op"] == op for r in rows):
            out += [f"## {op}", ""] + op_table(op, rows, ratio_rows, backends) + [""]
    out += ddp_table(rows, ratio_rows, backends)
    out += pp_table(rows, ratio_rows, backends)
    if errors:
        out += ["", "## Errors", ""] + [f"- {e}" for e in errors]
    if h["options"].get("check"):
        out += ["", f"--check: {len(mismatches)} mismatches"] + [f"- {m}" for m in mismatches[:50]]
    return "\n".join(out).rstrip() + "\n"
