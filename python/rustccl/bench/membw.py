"""The host's copy bandwidth, measured in the same run as the sweep.

Every rank copies a 64 MiB float32 tensor into another (``Tensor.copy_``,
on the threads torch has: one under the bench's OMP_NUM_THREADS=1) five
times, all ranks at once after a barrier, so the figure is what one rank
gets while its host's other ranks copy too, the situation of a collective.
``copy_GBps`` is bytes copied per second (each byte counted once), the
median of the five; per host, the median over its ranks. Each result row
then carries ``busbw_frac`` = busbw / the copy_GBps of rank 0's host.
"""

from __future__ import annotations

import socket
import statistics
import time

import torch
import torch.distributed as dist

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


def annotate(rows: list[dict], copy: dict, host0: str) -> None:
    bw = copy.get(host0)
    if not bw:
        return
    for r in rows:
        if r.get("kind") == "result" and "busbw_GBps" in r:
            r["busbw_frac"] = r["busbw_GBps"] / bw
