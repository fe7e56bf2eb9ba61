"""Per-call time of small CPU collectives on rustccl alone (no other
backend in the process): 5 loops of 4000 back-to-back calls of 8-byte
broadcast, all_reduce, all_gather, gather, scatter, all_to_all (list and single) and an async
all_reduce waited through its future, reduce and reduce_scatter, and of a
send/recv ping-pong between ranks 2k and 2k+1 (reported per one-way
message), median per op, printed by
rank 0 with PYTHONPATH (which build ran) and RUSTCCL_CALLER_RUNS_US. For A/B of two builds installed with
``pip install --no-deps --target DIR wheel``, alternate:

    for v in A B A B; do PYTHONPATH=/tmp/$v OMP_NUM_THREADS=1 \\
        torchrun --nproc_per_node=2 benchmarks/cpu_small_latency.py; done

Settings: ELEMS (float32 elements per tensor, 2 unless set: reduce_scatter's
input is ranks x that), CALLS (calls per loop, 4000), OPS (only these, comma
separated).
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

import rustccl  # noqa: F401  (registers the backend)
from rustccl import _rustccl

PROFILE = os.environ.get("RUSTCCL_HOST_PROFILE") == "1"
# With RUSTCCL_HOST_PROFILE=1: per op, the last round's rustccl spans
# (calls and microseconds per call of the op), on every rank.
SPANS = {}


# ELEMS: float32 elements per tensor (2: 8 bytes); CALLS: calls per loop.
ELEMS = int(os.environ.get("ELEMS", "2"))
CALLS = int(os.environ.get("CALLS", "4000"))


def per_call_us(fn, n=CALLS, warmup=None, name=None):
    warmup = warmup if warmup is not None else max(n // 10, 5)
    for _ in range(warmup):
        fn()
    dist.barrier()
    _rustccl._host_profile(True)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    if PROFILE and name:
        SPANS[name] = {s: (round(c / n, 2), round(ns / n / 1e3, 2)) for s, c, ns in _rustccl._host_profile(True) if c}
    return dt


def main():
    dist.init_process_group("rustccl")
    x = torch.ones(ELEMS)
    outs = [torch.empty(ELEMS) for _ in range(dist.get_world_size())]
    flat = torch.ones(ELEMS * dist.get_world_size())
    flat_out = torch.empty_like(flat)
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1

    def ping_pong():
        if peer >= world:
            return
        if rank % 2 == 0:
            dist.send(x, peer)
            dist.recv(x, peer)
        else:
            dist.recv(x, peer)
            dist.send(x, peer)

    ins = [torch.ones(ELEMS) for _ in range(world)]
    calls = {
        "send_recv_oneway": ping_pong,
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: dist.all_gather(outs, x),
        "gather": lambda: dist.gather(x, outs if rank == 0 else None, 0),
        "scatter": lambda: dist.scatter(x, ins if rank == 0 else None, 0),
        "all_to_all": lambda: dist.all_to_all(outs, ins),
        "all_to_all_single": lambda: dist.all_to_all_single(flat_out, flat),
        "reduce": lambda: dist.reduce(x, 0),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(x, flat),
        # async, waited through the c10 future (which cannot run it itself)
        "all_reduce_future": lambda: dist.all_reduce(x, async_op=True).get_future().wait(),
    }
    only = [k for k in os.environ.get("OPS", "").split(",") if k]
    calls = {k: fn for k, fn in calls.items() if not only or k in only}
    res = {k: [] for k in calls}
    for _ in range(5):
        for k, fn in calls.items():
            res[k].append(per_call_us(fn, name=k) / (2 if k == "send_recv_oneway" else 1))
    if dist.get_rank() == 0:
        env = {k: os.environ[k] for k in ("PYTHONPATH", "RUSTCCL_CALLER_RUNS_US") if k in os.environ}
        print(env, {k: round(statistics.median(v), 1) for k, v in res.items()})
    if PROFILE:
        spans = [None] * dist.get_world_size()
        dist.all_gather_object(spans, SPANS)
        if dist.get_rank() == 0:
            for k in calls:
                print(f"{k} (calls, us per {k} call):")
                for r, s in enumerate(spans):
                    print(f"  rank {r}: " + ", ".join(f"{n} {c}x {t}" for n, (c, t) in s.get(k, {}).items()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
