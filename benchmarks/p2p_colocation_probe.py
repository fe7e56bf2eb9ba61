"""Probe: small send/recv latency between 2 ranks of one host, right after
something else ran between the same ranks. Each round: a gap (MODE), then 5
untimed and 50 timed ping-pongs of NB bytes over rustccl; prints the median
one-way time over the rounds (and p10 / p90) on rank 0.

MODE: ab    -- 55 ping-pongs over a gloo group first (what the A/B
               benchmark does between rustccl's rounds);
      sleep -- the ranks sleep 8 ms (about as long);
      spin  -- the ranks busy-wait 8 ms;
      solo  -- nothing.
PIN=1 pins each rank's main thread to core `rank`, PIN=same both to core 0 (rustccl's own threads,
started at init, stay unpinned).

    OMP_NUM_THREADS=1 MODE=ab python -m torch.distributed.run \
        --standalone --nproc-per-node 2 benchmarks/p2p_colocation_probe.py
"""

import os
import time

import torch
import torch.distributed as dist

import rustccl  # noqa: F401

dist.init_process_group("rustccl")
r = dist.get_rank()
if os.environ.get("PIN"):
    os.sched_setaffinity(0, {0} if os.environ["PIN"] == "same" else {r})
gloo = dist.new_group(backend="gloo")


def ping_pong(x, y, g):
    if r == 0:
        dist.send(x, 1, group=g)
        dist.recv(y, 1, group=g)
    else:
        dist.recv(y, 0, group=g)
        dist.send(x, 0, group=g)


nb, mode = int(os.environ.get("NB", "2048")), os.environ.get("MODE", "ab")
x, y = torch.ones(max(nb // 4, 1)), torch.empty(max(nb // 4, 1))
rounds = []
end = time.time() + float(os.environ.get("SECS", "6"))
while time.time() < end:
    if mode == "ab":
        for _ in range(55):
            ping_pong(x, y, gloo)
    elif mode == "sleep":
        time.sleep(0.008)
    elif mode == "spin":
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.008:
            pass
    for _ in range(5):
        ping_pong(x, y, None)
    t = time.perf_counter()
    for _ in range(50):
        ping_pong(x, y, None)
    rounds.append((time.perf_counter() - t) / 100 * 1e6)
if r == 0:
    rounds.sort()
    k = len(rounds)
    print(f"mode {mode} pin {os.environ.get('PIN', 'no')} {nb} B: {k} rounds, one-way median {rounds[k // 2]:.1f} us "
          f"(p10 {rounds[k // 10]:.1f}, p90 {rounds[9 * k // 10]:.1f})", flush=True)
dist.destroy_process_group()
