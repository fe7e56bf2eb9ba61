"""Rank-side bodies: stats counters and profiler events."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import rustccl
from refs import Checker


def counters(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    rustccl.reset_stats()
    s0 = rustccl.stats()
    c.true(f"empty after reset: {s0['ops']}", s0["ops"] == {})
    # ranks of one host talk over shared memory unless RUSTCCL_TRANSPORT=tcp
    c.true(f"group info {s0}", s0["rank"] == rank and s0["size"] == world and s0["transport"] == "shm")
    small, big = torch.ones(10), torch.ones(100_000)
    for _ in range(5):
        dist.all_reduce(small)
    for _ in range(3):
        dist.all_reduce(big)
    outs = [torch.empty(7) for _ in range(world)]
    dist.all_gather(outs, torch.ones(7))
    if rank == 0:
        dist.send(torch.ones(3), 1)
    elif rank == 1:
        dist.recv(torch.empty(3), 0)
    dist.barrier()
    s = rustccl.stats()
    ar = s["ops"]["all_reduce"]
    c.true(f"all_reduce calls {ar['calls']}", ar["calls"] == 8)
    c.true(f"all_reduce bytes {ar['bytes']}", ar["bytes"] == 5 * 40 + 3 * 400_000)
    c.true(f"all_reduce timed {ar}", ar["timed_calls"] == 8 and ar["total_s"] > 0 and ar["avg_us"] > 0)
    c.true(f"busbw {ar['busbw_GBps']}", ar["busbw_GBps"] > 0 and ar["recent_busbw_GBps"] > 0)
    c.true(f"algorithm {ar['algorithm']}", ar["algorithm"] == "shm_pipelined")  # the last call was large
    c.true(f"transport {ar['transport']}", ar["transport"] == "shm")
    ag = s["ops"]["all_gather"]
    c.true(f"all_gather bytes {ag['bytes']}", ag["calls"] == 1 and ag["bytes"] == 7 * 4 * world)
    c.true("barrier counted", s["ops"]["barrier"]["calls"] == 1)
    algs = ar["algorithms"]
    c.true(f"all_reduce per algorithm {algs}", algs == {"shm_one_round": 5, "shm_pipelined": 3})
    if rank in (0, 1):
        key = "send" if rank == 0 else "recv"
        c.true(f"{key} counted: {s['ops'].get(key)}", s["ops"][key]["calls"] == 1 and s["ops"][key]["bytes"] == 12)
        c.true(f"{key} through the ring: {s['ops'][key]}", s["ops"][key]["algorithms"] == {"shm_ring": 1})
    g = dist.new_group()
    dist.all_reduce(torch.ones(4), group=g)
    c.true("a group's own counters", rustccl.stats(g)["ops"]["all_reduce"]["calls"] == 1)
    c.true("default group unchanged", rustccl.stats()["ops"]["all_reduce"]["calls"] == 8)
    rustccl.reset_stats()
    c.true("reset all", rustccl.stats()["ops"] == {} and rustccl.stats(g)["ops"] == {})
    return c.count, c.failures


# Floats a message: four of 200 KiB, staged by value, each sent before any
# receive of them (the receiver takes each out of the staging area at
# once, which frees it for the next); a small one through the ring; 1 MiB
# staged by rendezvous; 12 MiB (over the 8 MiB staging area) read by the
# receiver.
P2P_BY_VALUE = 50 << 10
P2P_ROUTES = [P2P_BY_VALUE] * 4 + [3000, 1 << 18, 3 << 20]


def p2p_routes(rank: int, world: int, expect_large: str) -> tuple[int, list[str]]:
    """Run with RUSTCCL_SHM_STAGED_SEND_MAX_BYTES=8388608: how each send
    and receive crossed, counted per route in stats()["ops"][op]["algorithms"]
    on both ranks, and the bytes intact. `expect_large`: the 12 MiB
    message's route (read, or split with its split threshold set; over TCP
    every message is "direct"). After each 200 KiB send, a token goes to
    rank 1 and back on tag 1: rings are read in order, so rank 1's engine
    took the message out (and acked it) before it got the token, and rank 0
    read the ack before the answer."""
    c = Checker(rank)
    rustccl.reset_stats()
    store = dist.distributed_c10d._get_default_store()
    token = torch.zeros(1)
    if rank == 0:
        last = None
        for i, n in enumerate(P2P_ROUTES):
            x = torch.arange(n, dtype=torch.float32) + i
            if i == len(P2P_ROUTES) - 1:
                last = dist.isend(x, 1)  # completes on its receive
            else:
                dist.send(x, 1)
            if n == P2P_BY_VALUE:
                dist.send(token, 1, tag=1)
                dist.recv(token, 1, tag=1)
        store.set("sent", "1")
        last.wait()
    else:
        for _ in range(P2P_ROUTES.count(P2P_BY_VALUE)):
            dist.recv(token, 0, tag=1)
            dist.send(token, 0, tag=1)
        store.wait(["sent"])
        for i, n in enumerate(P2P_ROUTES):
            y = torch.zeros(n)
            dist.recv(y, 0)
            c.true(f"message {i} intact", torch.equal(y, torch.arange(n, dtype=torch.float32) + i))
    op = "send" if rank == 0 else "recv"
    algs = rustccl.stats()["ops"][op]["algorithms"]
    tokens = P2P_ROUTES.count(P2P_BY_VALUE)
    if expect_large == "direct":
        want = {"direct": len(P2P_ROUTES) + tokens}
    else:
        want = {"shm_staged": tokens + 1, "shm_ring": tokens + 1, expect_large: 1}
    c.true(f"{op} routes {algs}, want {want}", algs == want)
    dist.barrier()
    return c.count, c.failures


def caller_runs(rank: int, world: int) -> tuple[int, list[str]]:
    """Run with RUSTCCL_CALLER_RUNS_US=5000000: torch's blocking calls are
    run by the waiting thread; async work is the worker's at once (not after
    the 5 s grace), whether its caller polls is_completed() or waits on the
    future."""
    c = Checker(rank)
    rustccl.reset_stats()
    for k in range(10):
        x = torch.full((5,), float(rank + k))
        dist.all_reduce(x)
        c.true(f"sum {k}: {x}", torch.equal(x, torch.full((5,), float(sum(range(world)) + world * k))))
    ar = rustccl.stats()["ops"]["all_reduce"]
    c.true(f"blocking calls run by the caller: {ar}", ar["calls"] == 10 and ar["by_caller"] == 10)
    t0 = time.monotonic()
    y = torch.full((3,), float(rank))
    w = dist.all_reduce(y, async_op=True)
    while not w.is_completed():
        pass
    z = torch.full((3,), 2.0 * rank)
    dist.all_reduce(z, async_op=True).get_future().wait()
    took = time.monotonic() - t0
    c.true(f"async work did not wait for the blocking calls' grace: {took:.2f} s", took < 2.5)
    total = float(sum(range(world)))
    c.true(f"async results {y} {z}", torch.equal(y, torch.full((3,), total)) and torch.equal(z, torch.full((3,), 2 * total)))
    ar = rustccl.stats()["ops"]["all_reduce"]
    c.true(f"async work run by the worker: {ar}", ar["calls"] == 12 and ar["by_caller"] == 10)
    return c.count, c.failures


def profiler(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    x = torch.ones(1000)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(x)
        outs = [torch.empty(3) for _ in range(world)]
        dist.all_gather(outs, torch.ones(3))
        dist.broadcast(x, 0, async_op=True).wait()
    names = {e.name for e in prof.events()}
    for want in ("rustccl:all_reduce", "rustccl:all_gather", "rustccl:broadcast"):
        c.true(f"{want} in profiler events ({sorted(n for n in names if 'rustccl' in n)})", want in names)
    shapes = [e.input_shapes for e in prof.events() if e.name == "rustccl:all_reduce"]
    c.true(f"all_reduce event has its input shape {shapes}", any([1000] in s for s in shapes))
    return c.count, c.failures


def keep_apart(rank: int, world: int) -> tuple[int, list[str]]:
    """Both ranks' main threads are put on one CPU (then given their whole
    mask back) before each round of 2 KiB ping-pongs. With
    RUSTCCL_SHM_KEEP_APART on (the default) the higher rank's waiting
    thread moves off that CPU (stats()["thread_moves"]) and the lower one
    never does; off, nobody moves. Either way the masks are the ones the
    threads had and every message arrives intact."""
    c = Checker(rank)
    mask = os.sched_getaffinity(0)
    on = os.environ.get("RUSTCCL_SHM_KEEP_APART", "1") != "0"
    th = rustccl.stats()["thresholds"]
    c.true(f"setting in force: {th.get('shm_keep_apart')}", th.get("shm_keep_apart") == int(on))
    x, y = torch.arange(512, dtype=torch.float32) + 1000 * rank, torch.empty(512)
    want = torch.arange(512, dtype=torch.float32) + 1000 * (1 - rank)
    moves = torch.zeros(2)
    for _ in range(40):
        dist.barrier()
        os.sched_setaffinity(0, {min(mask)})
        os.sched_setaffinity(0, mask)
        for i in range(200):
            y.fill_(-1)
            if rank == 0:
                dist.send(x, 1)
                dist.recv(y, 1)
            else:
                dist.recv(y, 0)
                dist.send(x, 0)
            if not torch.equal(y, want):
                c.true(f"ping-pong {i}: {y[:4]}", False)
                break
        moves = torch.zeros(2)
        moves[rank] = rustccl.stats()["thread_moves"]
        dist.all_reduce(moves)
        if moves[1] > 0:
            break
    c.true(f"masks kept: {os.sched_getaffinity(0)} vs {mask}", os.sched_getaffinity(0) == mask)
    c.true(f"the lower rank never moves: {moves}", moves[0] == 0)
    if on and len(mask) > 1:
        c.true(f"the higher rank moved off the shared CPU: {moves}", moves[1] > 0)
    else:
        c.true(f"nobody moves (setting off, or one CPU allowed): {moves}", moves[1] == 0)
    return c.count, c.failures
