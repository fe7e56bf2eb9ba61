"""The host's copy bandwidth, measured in the same run as the sweep.

Every rank copies a 64 MiB float32 tensor into another (``Tensor.copy_``,
on the threads torch has: one under the bench's OMP_NUM_THREADS=1) five
times, all ranks at once after a barrier, so the figure is what one rank
gets while its host's other ranks copy too, the situation of a collective.
``copy_GBps`` is bytes copied per second (each byte counted once), the
median of the five; per host, the median over its ranks. Each result row
then carries ``busbw_frac`` = busbw / the copy_GBps of rank 0's host.

Then the same with as many threads per rank as rustccl's shared-memory
algorithms use (cores / ranks of the host, 1-8): the header's
``host_copy`` gives per host ``GBps``, the sum over its ranks (what the
host's memory moves with every core copying), ``threads`` and ``llc``. A row whose tensors are far larger than the last-level cache
(``metrics.footprint`` >= 2x the cache, so they stream through memory)
gets ``mem_floor_us``: ``metrics.memory_traffic`` at that speed (a copied
byte is read once and written once), the time of a backend that moved
no byte more than it must. Below that size the caches beat it, and no
floor is given.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

from . import metrics

NBYTES = 64 << 20


def per_rank() -> float:
    src = torch.ones(NBYTES // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return NBYTES / statistics.median(times) / 1e9


def measure(world: int) -> dict:
    """{host: GB/s per rank}; a collective over the default group."""
    dist.barrier()
    mine = (socket.gethostname(), per_rank())
    got = [None] * world
    dist.all_gather_object(got, mine)
    hosts: dict[str, list[float]] = {}
    for h, v in got:
        hosts.setdefault(h, []).append(v)
    return {h: round(statistics.median(v), 2) for h, v in hosts.items()}


def threads_per_rank(local_ranks: int) -> int:
    """rustccl's own rule for its shared-memory worker threads (the cores
    this process may run on / ranks of the host, 1-8)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // max(1, local_ranks)))


def measure_host(world: int) -> dict:
    """{host: {"GBps": copied bytes/s of all its ranks at once, "threads":
    threads per rank, "llc": last-level cache bytes or None}}."""
    host = socket.gethostname()
    names = [None] * world
    dist.all_gather_object(names, host)
    threads = threads_per_rank(names.count(host))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dist.barrier()
        mine = (host, per_rank(), threads, last_level_cache())
    finally:
        torch.set_num_threads(before)
    got = [None] * world
    dist.all_gather_object(got, mine)
    out: dict[str, dict] = {}
    for h, v, t, llc in got:
        e = out.setdefault(h, {"GBps": 0.0, "threads": t, "llc": llc})
        e["GBps"] = round(e["GBps"] + v, 2)
    return out


def last_level_cache() -> int | None:
    """Bytes of this host's largest cache (sysfs), None if unknown."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        entries = [e for e in os.listdir(base) if e.startswith("index")]
    except OSError:
        return None
    for idx in entries:
        try:
            with open(os.path.join(base, idx, "size")) as f:
                txt = f.read().strip()
            v = int(txt.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
        except (OSError, ValueError):
            continue
        best = v if best is None else max(best, v)
    return best


def annotate(rows: list[dict], copy: dict, host0: str, host_copy: dict | None = None) -> None:
    bw = copy.get(host0)
    if not bw:
        return
    hc = (host_copy or {}).get(host0) if len(copy) == 1 else None
    for r in rows:
        if r.get("kind") == "result" and "busbw_GBps" in r:
            r["busbw_frac"] = r["busbw_GBps"] / bw
            if hc and hc.get("llc") and hc.get("GBps"):
                t = metrics.memory_traffic(r["op"], r["bytes"], r["world"])
                if t is not None and metrics.footprint(r["op"], r["bytes"], r["world"]) >= 2 * hc["llc"]:
                    r["mem_floor_us"] = t / (2 * hc["GBps"] * 1e9) * 1e6
