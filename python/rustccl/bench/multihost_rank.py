"""One rank of ``python -m rustccl.bench --hosts 2 --link LINK`` (launched
by torchrun's multi-node rendezvous inside a host's network namespace; see
:mod:`rustccl.bench.multihost`).

1. all_reduce sweep (float32, SUM): one rustccl group per codec ("none",
   "bf16", "fp16", "int8", set with :func:`rustccl.set_compression`), all
   over the same ranks; for each size the groups are timed in turn, the
   order rotating every round, and the median round is reported. Each row
   also carries the codec's relative error (L2, against the uncompressed
   group's result of the same inputs) and the bytes this host sent over its
   link per call (kernel counter of the veth end).
2. DDP toy training (the seeds' model: 3 x Linear(SIZE, SIZE), ReLU, MSE to
   a fixed low-rank teacher, SGD, as benchmarks/hooks_cpu.py), the same
   steps from the same seed per configuration: DDP's own all-reduce, the
   Python hooks of :mod:`rustccl.hooks`, and the engine hook
   :func:`rustccl.hooks.engine_compression`. Reported: median step time from
   step 10 on (slowest rank), final loss on a held-out batch, bytes this
   host sent over its link per step, and rustccl's between-hosts count.

Rank 0 writes ``<out>/<name>.jsonl`` and ``<name>.md``.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import rustccl
import rustccl.hooks as H

CODECS = ("none", "bf16", "fp16", "int8")


def link_tx() -> int:
    """Bytes this host has sent over its link (RUSTCCL_BENCH_DEV's counter)."""
    with open(f"/sys/class/net/{os.environ['RUSTCCL_BENCH_DEV']}/statistics/tx_bytes") as f:
        return int(f.read())


def slowest(v: float) -> float:
    t = torch.tensor([v], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def sweep(a, base: dict) -> list:
    groups = {}
    for c in CODECS:
        groups[c] = dist.new_group(backend="rustccl")
        rustccl.set_compression(groups[c], None if c == "none" else c)
    rank = dist.get_rank()
    rows = []
    size = a.min_bytes
    while size <= a.max_bytes:
        n = size // 4
        x0 = torch.randn(n, generator=torch.Generator().manual_seed(rank)) * (1 + rank)
        exact = x0.clone()
        dist.all_reduce(exact, group=groups["none"])
        times = {c: [] for c in CODECS}
        tx = {c: [] for c in CODECS}
        err = {}
        for c in CODECS:  # warm-up, and the error of one call
            y = x0.clone()
            dist.all_reduce(y, group=groups[c])
            err[c] = ((y - exact).norm() / exact.norm()).item()
        iters = a.iters if size < (16 << 20) else max(1, a.iters // 2)
        for rnd in range(a.rounds):
            order = CODECS[rnd % len(CODECS):] + CODECS[:rnd % len(CODECS)]
            for c in order:
                y = x0.clone()
                dist.barrier(group=groups["none"])
                b0, t0 = link_tx(), time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(y, group=groups[c])
                dt = slowest((time.perf_counter() - t0) / iters)
                times[c].append(dt)
                tx[c].append((link_tx() - b0) / iters)
        for c in CODECS:
            us = statistics.median(times[c]) * 1e6
            rows.append(dict(base, kind="all_reduce", backend="rustccl", op="all_reduce", codec=c, bytes=size,
                             dtype="float32", us=round(us, 1), rounds=[round(t * 1e6, 1) for t in times[c]],
                             speedup_vs_none=None, rel_err=float(f"{err[c]:.3g}"),
                             link_bytes_per_call=int(statistics.median(tx[c]))))
        base_us = rows[-len(CODECS)]["us"]
        for r in rows[-len(CODECS):]:
            r["speedup_vs_none"] = round(base_us / r["us"], 2)
        if rank == 0:
            print(" ".join(f"{r['codec']}={r['us'] / 1e3:.1f}ms" for r in rows[-len(CODECS):]), f"@ {size >> 20} MiB",
                  flush=True)
        size *= a.factor
    for g in groups.values():
        dist.destroy_process_group(g)
    return rows


def ddp_configs(a):
    return {
        "none": None,
        "fp16 hook": lambda: (H.CommState(), H.fp16_compress_hook),
        "powersgd r=1 hook": lambda: (H.PowerSGDState(matrix_approximation_rank=1, start_iter=a.start_iter), H.powersgd_hook),
        "topk 1% hook": lambda: (H.TopKState(ratio=0.01), H.topk_hook),
        "int8 hook": lambda: (H.QuantState(), H.int8_hook),
        "engine bf16": lambda: (H.CommState(), H.engine_compression("bf16")),
        "engine int8": lambda: (H.CommState(), H.engine_compression("int8")),
    }


def train(name, make, a, base: dict) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(a.size, a.size), nn.ReLU(), nn.Linear(a.size, a.size), nn.ReLU(),
                          nn.Linear(a.size, a.size))
    g = torch.Generator().manual_seed(1)
    teacher = (torch.randn(a.size, 16, generator=g) @ torch.randn(16, a.size, generator=g)).div_((a.size * 16) ** 0.5)
    ddp = DDP(model)
    if make is not None:
        state, hook = make()
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    times = []
    rustccl.reset_stats()
    dist.barrier()
    for step in range(a.steps):
        if step == a.start_iter:
            tx0 = link_tx()
            rustccl.reset_stats()
        x = torch.randn(a.batch, a.size, generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(ddp(x), x @ teacher).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    counted = a.steps - a.start_iter
    link = (link_tx() - tx0) / counted
    ops = rustccl.stats()["ops"]
    engine_between = sum(o.get("between_hosts_bytes", 0) for o in ops.values()) / counted
    xe = torch.randn(1024, a.size, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        loss = F.mse_loss(model(xe), xe @ teacher).item()
    step_ms = slowest(statistics.median(times[a.start_iter:])) * 1e3
    codec = {"none": "none"}.get(name, name.replace(" hook", "").replace("engine ", ""))
    return dict(base, kind="ddp", backend="rustccl", codec=codec, config=name, in_engine=name.startswith("engine"),
                step_ms=round(step_ms, 2), final_loss=round(loss, 5), link_bytes_per_step=int(link),
                engine_between_hosts_bytes_per_step=int(engine_between), size=a.size, batch=a.batch, steps=a.steps,
                lr=a.lr, grad_bytes=sum(p.numel() * 4 for p in model.parameters()))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--link", required=True)
    p.add_argument("--shaping", default="")
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--machine", default="devbox")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--configs", default="", help="comma-separated subset of the DDP configurations")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--start-iter", type=int, default=10)
    p.add_argument("--lr", type=float, default=4.0)
    a = p.parse_args()
    dist.init_process_group("rustccl")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    base = {"link": a.link, "shaping": a.shaping, "machine": a.machine, "world": world, "hosts": 2,
            "ranks_per_host": int(os.environ.get("LOCAL_WORLD_SIZE", 1)), "torch": torch.__version__}
    rows = []
    if not a.no_sweep:
        rows += sweep(a, base)
    if not a.no_ddp:
        wanted = [c.strip() for c in a.configs.split(",") if c.strip()]
        for name, make in ddp_configs(a).items():
            if wanted and name not in wanted:
                continue
            rows.append(train(name, make, a, base))
            if rank == 0:
                r = rows[-1]
                print(f"ddp {name}: {r['step_ms']} ms/step, loss {r['final_loss']}, "
                      f"{r['link_bytes_per_step'] / 2**20:.2f} MiB/step over the link", flush=True)
    if rank == 0:
        from .multihost_report import markdown

        os.makedirs(a.out, exist_ok=True)
        stem = os.path.join(a.out, a.name)
        with open(stem + ".jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        with open(stem + ".md", "w") as f:
            f.write(markdown(rows, a))
        print(markdown(rows, a), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
