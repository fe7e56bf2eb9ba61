"""Ping-pong between 2 ranks over rustccl: one-way time of send/recv per
size, median (and min) of 7 rounds, each round ~64 MiB moved each way.
For A/B runs of a setting, run it with the setting on and off alternately:

    for v in off auto off auto; do TAG=$v RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES=$v \\
      OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone \\
      --nproc-per-node 2 benchmarks/p2p_pingpong.py; done

SIZES: bytes, comma-separated (default 512 KiB, 1, 4, 16 MiB). TAG: a label
printed on each line. Also prints the split-send threshold in force.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

import rustccl

dist.init_process_group("rustccl")
r = dist.get_rank()
sizes = [int(s) for s in os.environ.get("SIZES", "524288,1048576,4194304,16777216").split(",")]
for n in sizes:
    x = torch.ones(n // 4)
    times = []
    for _ in range(7):
        it = max(5, (64 << 20) // n)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(it):
            if r == 0:
                dist.send(x, 1)
                dist.recv(x, 1)
            else:
                dist.recv(x, 0)
                dist.send(x, 0)
        times.append((time.perf_counter() - t0) / it / 2 * 1e6)
    if r == 0:
        print(f"{os.environ.get('TAG', '')} {n >> 10} KiB one way: median {statistics.median(times):.0f} us (min {min(times):.0f})", flush=True)
if r == 0:
    print("shm_split_send_min_bytes", rustccl.stats()["thresholds"]["shm_split_send_min_bytes"])
dist.destroy_process_group()
