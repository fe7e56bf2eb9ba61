"""Quick CUDA probe: time per call, rustccl vs torch nccl in the same
processes on the same tensors, backends interleaved, median of rounds.

    torchrun --nproc_per_node=N benchmarks/cuda_probe.py            # all_reduce
    PROBE_OPS=all_gather,reduce_scatter torchrun ... cuda_probe.py  # the _tensor forms
    RUSTCCL_HOST_PROFILE=1 PROBE_HOST=1 torchrun ... cuda_probe.py  # where an 8 B all_reduce's host time goes

Per op and size, two timings per backend:
  - eager: a host loop of synchronous calls, device sync at the end (as the
    anchors measure), so host cost per call counts;
  - graph: 50 calls captured in a CUDA graph, replays timed with CUDA
    events, so only device time counts (the kernels alone, back to back).
Also the algorithm rustccl used. PROBE_SIZES=8,1024,... overrides the sizes
(bytes per rank: the all_reduce tensor, the all_gather output, the
reduce_scatter input). Run it with RUSTCCL_ONE_SHOT_MAX_BYTES /
RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES / RUSTCCL_CUSTOM_GATHER_MAX_BYTES set
to force a path and find where it stops beating NCCL.

PROBE_HOST=1 adds the host-path breakdown of an eager 8 B all_reduce
(needs RUSTCCL_HOST_PROFILE=1): host time per async call and per
synchronous call (call + work.wait()) while the device is busy (so only
the host path counts) for rustccl, nccl and torch's "fake" backend
(torch's dispatch with a backend that does nothing), and rustccl's own
spans for each. The full sweep is `python -m rustccl.bench --device cuda`.
"""
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import rustccl

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("rustccl")
groups = {"rustccl": None, "nccl": dist.new_group(backend="nccl")}
OPS = os.environ.get("PROBE_OPS", "all_reduce").split(",")
STAT = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter"}
BUSBW = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world, "reduce_scatter": (world - 1) / world}


def emit(row):
    if rank == 0:
        print(json.dumps(row), flush=True)


def timed(fn, iters):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def call(op, nbytes, g):
    """The zero-argument call of `op` at `nbytes` (per rank) in group `g`."""
    n = max(nbytes // 4, world)
    n -= n % world
    if op == "all_reduce":
        x = torch.ones(n, device="cuda")
        return lambda: dist.all_reduce(x, group=g)
    if op == "all_gather":
        x, out = torch.ones(n // world, device="cuda"), torch.empty(n, device="cuda")
        return lambda: dist.all_gather_into_tensor(out, x, group=g)
    x, out = torch.ones(n, device="cuda"), torch.empty(n // world, device="cuda")
    return lambda: dist.reduce_scatter_tensor(out, x, group=g)


def graph_us(fn, calls=50, replays=5):
    """Device time per call of `calls` calls captured in one graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        dist.all_reduce(torch.zeros(1))  # CPU barrier: replays start together
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


SIZES = [8, 1024, 32768, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 1 << 28]
if os.environ.get("PROBE_SIZES"):  # e.g. PROBE_SIZES=1048576,4194304
    SIZES = [int(v) for v in os.environ["PROBE_SIZES"].split(",")]
NO_GRAPH = os.environ.get("PROBE_GRAPH", "1") == "0"

for op in OPS:
    for nbytes in SIZES:
        fns = {name: call(op, nbytes, g) for name, g in groups.items()}
        iters = 100 if nbytes <= (1 << 20) else 20 if nbytes <= (64 << 20) else 5
        samples = {k: [] for k in groups}
        for fn in fns.values():
            for _ in range(10):
                fn()
        for r in range(7):
            for name in (list(groups) if r % 2 == 0 else list(groups)[::-1]):
                samples[name].append(timed(fns[name], iters))
        row = {"op": op, "bytes": nbytes, "world": world}
        for name in groups:
            us = statistics.median(samples[name])
            row[name + "_us"] = round(us, 2)
            row[name + "_busbw"] = round(nbytes / us / 1e3 * BUSBW[op], 2)
        row["ratio_us"] = round(row["rustccl_us"] / row["nccl_us"], 3)
        torch.cuda.synchronize()
        time.sleep(0.02)  # the watchdog records the stats of the last call
        row["rustccl_algorithm"] = rustccl.stats()["ops"].get(STAT[op], {}).get("algorithm")
        if not NO_GRAPH:
            for name in groups:
                row[name + "_graph_us"] = round(graph_us(fns[name]), 2)
            row["ratio_graph_us"] = round(row["rustccl_graph_us"] / row["nccl_graph_us"], 3)
        emit(row)
        del fns

# host launch cost: async calls, no waiting, device kept busy first
x = torch.ones(2, device="cuda")
for name, g in groups.items():
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # keep the device busy so launches only queue
    t0 = time.perf_counter()
    works = [dist.all_reduce(x, group=g, async_op=True) for _ in range(200)]
    us = (time.perf_counter() - t0) / 200 * 1e6
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    emit({"host_launch_us": name, "us": round(us, 2)})

if os.environ.get("PROBE_HOST") == "1":
    # Where an eager 8 B all_reduce spends its host time. Each number is a
    # median over rounds of 200 calls queued behind a busy device.
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401  (registers "fake")

    fake = None
    try:
        fake = dist.new_group(backend="fake")
    except Exception as e:  # noqa: BLE001 - the breakdown works without it
        emit({"host_breakdown_note": f"no fake backend group: {e}"})
    cand = dict(groups, **({"fake": fake} if fake is not None else {}))

    def queued(g, n=200):
        """(submit, wait) us per async call, then us per synchronous call
        (torch's default: the call and its work.wait()), every call queued
        behind a busy device so that only the host path counts."""
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        t0 = time.perf_counter()
        ws = [dist.all_reduce(x, group=g, async_op=True) for _ in range(n)]
        t1 = time.perf_counter()
        for w in ws:
            w.wait()
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6

    def queued_sync(g, n=200):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(x, group=g)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    def spans_us():
        return {k: ns / max(c, 1) / 1e3 for k, c, ns in rustccl._rustccl._host_profile(True)}

    res = {k: {"submit": [], "wait": [], "sync": []} for k in cand}
    spans, sync_spans = [], []
    for r in range(7):
        for name, g in cand.items():
            if name == "rustccl":
                spans_us()  # reset
            s, w = queued(g)
            res[name]["submit"].append(s)
            res[name]["wait"].append(w)
            if name == "rustccl":
                spans.append(spans_us())
            res[name]["sync"].append(queued_sync(g))
            if name == "rustccl":
                sync_spans.append(spans_us())
    row = {"host_breakdown": "all_reduce 8 B, calls queued behind a busy device, us per call (median of 7 x 200): "
                             "async (submit, then wait), and synchronous (call + wait)"}
    for name in cand:
        row[name + "_submit_us"] = round(statistics.median(res[name]["submit"]), 2)
        row[name + "_wait_us"] = round(statistics.median(res[name]["wait"]), 2)
        row[name + "_sync_us"] = round(statistics.median(res[name]["sync"]), 2)
    for k in spans[0]:
        row["rustccl_span_" + k + "_us"] = round(statistics.median(s[k] for s in spans), 2)
    for k in sync_spans[0]:
        row["rustccl_sync_span_" + k + "_us"] = round(statistics.median(s[k] for s in sync_spans), 2)
    emit(row)
    # eager synchronous loop for the same three, for reference
    e = {name: statistics.median(timed(lambda g=g: dist.all_reduce(x, group=g), 200) for _ in range(5)) for name, g in cand.items()}
    emit({"host_breakdown_eager_us": {k: round(v, 2) for k, v in e.items()}})
dist.destroy_process_group()
