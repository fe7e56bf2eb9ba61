"""Where the time of one small one-way message goes: ranks pair up
(2k <-> 2k+1) and ping-pong NB bytes (default 8) through, alternately in
each round,

* ``torch-rustccl``: ``dist.send`` / ``dist.recv`` on a rustccl group (torch's
  Python and dispatch, the C++ shim, the engine);
* ``torch-gloo``: the same on a gloo group;
* ``raw``: ``rustccl.Communicator.send`` / ``recv`` on numpy arrays (a second
  communicator over the same ranks: pyo3 and the engine, no torch);

(``ONLY=torch-rustccl,raw`` keeps those) and prints, on rank 0, the median one-way time of each over ROUNDS rounds
(p10 / p90 beside it) and, with ``RUSTCCL_HOST_PROFILE=1``, rustccl's spans
per message.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \\
        benchmarks/p2p_latency_parts.py
"""

import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

import rustccl
from rustccl import _rustccl

NB = int(os.environ.get("NB", "8"))
ROUNDS = int(os.environ.get("ROUNDS", "7"))
N = int(os.environ.get("N", "2000"))


def main():
    dist.init_process_group("rustccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1
    gloo = dist.new_group(backend="gloo")
    store = dist.PrefixStore("p2p-parts", dist.distributed_c10d._get_default_store())
    raw = rustccl.Communicator.bootstrap(store, rank, world, 60.0, "p2p-parts")
    x = torch.zeros(max(NB // 4, 1))
    a = np.zeros(max(NB // 4, 1), dtype=np.float32)

    def torch_pp(g):
        def f():
            if rank % 2 == 0:
                dist.send(x, peer, group=g)
                dist.recv(x, peer, group=g)
            else:
                dist.recv(x, peer, group=g)
                dist.send(x, peer, group=g)
        return f

    def raw_pp():
        if rank % 2 == 0:
            raw.send(a, peer)
            raw.recv(a, peer)
        else:
            raw.recv(a, peer)
            raw.send(a, peer)

    fns = {"torch-rustccl": torch_pp(None), "torch-gloo": torch_pp(gloo), "raw": raw_pp}
    if os.environ.get("ONLY"):
        fns = {k: v for k, v in fns.items() if k in os.environ["ONLY"].split(",")}
    times = {k: [] for k in fns}
    active = peer < world
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            dist.barrier(group=gloo)
            if not active:
                continue
            for _ in range(100):
                fn()
            if name == "torch-rustccl":
                _rustccl._host_profile(True)
            t0 = time.perf_counter()
            for _ in range(N):
                fn()
            times[name].append((time.perf_counter() - t0) / N / 2 * 1e6)
            if name == "torch-rustccl":
                spans = _rustccl._host_profile(False)
    if rank == 0:
        print(f"world {world}, {NB} B one way, {ROUNDS} rounds of {N} ping-pongs, cores {os.cpu_count()}")
        for name, ts in times.items():
            ts = sorted(ts)
            print(f"  {name:14s} median {statistics.median(ts):6.2f} us  (p10 {ts[len(ts) // 10]:.2f}, p90 {ts[(9 * len(ts)) // 10]:.2f})")
        for name, calls, nanos in spans:
            if calls:
                print(f"  span {name:14s} {calls / (2 * N):5.2f} per message, {nanos / calls / 1e3:6.2f} us each")
    raw.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
