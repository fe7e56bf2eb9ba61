"""Quick CUDA probe: all_reduce time per call, rustccl vs torch nccl in the
same processes on the same tensors, backends interleaved, median of rounds.

    torchrun --nproc_per_node=N benchmarks/cuda_probe.py

Per size, two timings per backend:
  - eager: a host loop of synchronous calls, device sync at the end (as the
    anchors measure), so host cost per call counts;
  - graph: 50 calls captured in a CUDA graph, replays timed with CUDA
    events, so only device time counts (the kernels alone, back to back).
Also the algorithm rustccl used, and the host-side launch cost (async calls
queued behind a busy device). The full sweep is
`python -m rustccl.bench --device cuda`.
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


def timed(fn, iters):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def graph_us(x, g, calls=50, replays=5):
    """Device time per call of `calls` all_reduces captured in one graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(x, group=g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            dist.all_reduce(x, group=g)
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


SIZES = [8, 1024, 32768, 65536, 262144, 1 << 20, 1 << 24, 1 << 28]
if os.environ.get("PROBE_SIZES"):  # e.g. PROBE_SIZES=1048576,4194304
    SIZES = [int(v) for v in os.environ["PROBE_SIZES"].split(",")]

for nbytes in SIZES:
    x = torch.ones(max(nbytes // 4, 1), device="cuda")
    iters = 100 if nbytes <= (1 << 20) else 10
    samples = {k: [] for k in groups}
    for g in groups.values():
        for _ in range(10):
            dist.all_reduce(x, group=g)
    for _ in range(5):
        for name, g in groups.items():
            samples[name].append(timed(lambda: dist.all_reduce(x, group=g), iters))
    row = {"bytes": nbytes}
    for name in groups:
        us = statistics.median(samples[name])
        row[name + "_us"] = round(us, 2)
        row[name + "_busbw"] = round(nbytes / us / 1e3 * 2 * (world - 1) / world, 2)
    row["ratio_us"] = round(row["rustccl_us"] / row["nccl_us"], 3)
    row["rustccl_algorithm"] = rustccl.stats()["ops"]["all_reduce"]["algorithm"]
    for name, g in groups.items():
        row[name + "_graph_us"] = round(graph_us(x, g), 2)
    row["ratio_graph_us"] = round(row["rustccl_graph_us"] / row["nccl_graph_us"], 3)
    if rank == 0:
        print(json.dumps(row), flush=True)

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
    if rank == 0:
        print(json.dumps({"host_launch_us": name, "us": round(us, 2)}), flush=True)
dist.destroy_process_group()
