"""Gradient compression hooks compared on the seeds' toy DDP model.

    python benchmarks/hooks_cpu.py                      # spawns 2 ranks, CPU, rustccl
    torchrun --nproc_per_node=2 benchmarks/hooks_cpu.py # the same under torchrun
    torchrun --nproc_per_node=4 benchmarks/hooks_cpu.py --device cuda --size 4000 --batch 1000 \\
        --host h200x4 --backend rustccl                 # on GPUs (or --backend nccl / gloo)

Model: three nn.Linear(SIZE, SIZE) with ReLU, MSE loss, plain SGD. Task: a
fixed random linear teacher; every rank draws fresh batches each step, and
the loss reported is on a held-out batch after the last step, so a lossy
hook shows up as a worse loss. Each configuration trains the same model
from the same seed:

- ``none``: DDP without a hook (its built-in all-reduce), the baseline;
- every hook of ``rustccl.hooks`` (PowerSGD compresses from step
  ``--start-iter``, before that it is plain all-reduce);
- ``bucketer``: no DDP, ``rustccl.bucketing.GradientBucketer`` with the
  bucket size it measures.

Reported per configuration (rank 0): bytes this rank put into collectives
in the last step and the compression ratio against a plain all-reduce,
median step time over the steps from ``--start-iter`` on, final loss.
Writes ``<out-dir>/<date>-<host>-<device>-hooks.{jsonl,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import rustccl  # noqa: F401  (registers the "rustccl" backend)
import rustccl.hooks as H
from rustccl.bucketing import GradientBucketer


def configs(a):
    """name -> (state, hook) factory; None: DDP's own all-reduce; "bucketer": no DDP."""
    return {
        "none": None,
        "allreduce": lambda: (H.CommState(), H.allreduce_hook),
        "fp16": lambda: (H.CommState(), H.fp16_compress_hook),
        "bf16": lambda: (H.CommState(), H.bf16_compress_hook),
        "powersgd r=1": lambda: (H.PowerSGDState(matrix_approximation_rank=1, start_iter=a.start_iter), H.powersgd_hook),
        "powersgd r=4": lambda: (H.PowerSGDState(matrix_approximation_rank=4, start_iter=a.start_iter), H.powersgd_hook),
        "topk 1%": lambda: (H.TopKState(ratio=0.01), H.topk_hook),
        "topk 1% no EF": lambda: (H.TopKState(ratio=0.01, use_error_feedback=False), H.topk_hook),
        "int8": lambda: (H.QuantState(), H.int8_hook),
        "bucketer": "bucketer",
    }


TEACHER_RANK = 16


def toy_model(size: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(size, size), nn.ReLU(), nn.Linear(size, size), nn.ReLU(), nn.Linear(size, size))


def run_one(name, make, a, rank, world, dev):
    model = toy_model(a.size).to(dev)
    g = torch.Generator().manual_seed(1)
    teacher = (torch.randn(a.size, TEACHER_RANK, generator=g) @ torch.randn(TEACHER_RANK, a.size, generator=g))
    teacher = teacher.div_((a.size * TEACHER_RANK) ** 0.5).to(dev)
    state, bucketer, ddp = None, None, model
    if make == "bucketer":
        state = H.CommState()
        bucketer = GradientBucketer(model, hook=(state, H.allreduce_hook))
    else:
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        if make is not None:
            state, hook = make()
            ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    times = []
    for step in range(a.steps):
        x = torch.randn(a.batch, a.size, generator=gen).to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(ddp(x), x @ teacher).backward()
        if bucketer is not None:
            bucketer.wait()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    xe = torch.randn(1024, a.size, generator=torch.Generator().manual_seed(7)).to(dev)
    with torch.no_grad():
        loss = F.mse_loss(model(xe), xe @ teacher).item()
    t = torch.tensor([statistics.median(times[a.start_iter:])], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    sent, plain = (state.last_step_bytes_sent, state.last_step_bytes_uncompressed) if state else (params, params)
    rec = {
        "hook": name, "bytes_per_step": sent, "compression": round(plain / sent, 2),
        "step_ms": round(t.item() * 1e3, 2), "final_loss": round(loss, 5),
        "backend": a.backend, "device": dev.type, "world": world, "size": a.size, "batch": a.batch,
        "steps": a.steps, "lr": a.lr, "torch": torch.__version__,
    }
    if bucketer is not None:
        rec["bucket_cap_mib"] = round(bucketer.bucket_cap_bytes / 2**20, 2)
        bucketer.remove()
    return rec


def markdown(recs, a, world) -> str:
    base = recs[0]["final_loss"]
    lines = [f"Toy DDP model, 3 x Linear({a.size}, {a.size}), batch {a.batch}/rank, {a.steps} SGD steps (lr {a.lr}), "
             f"{world} ranks, {a.device}, backend {a.backend}, {a.host}, torch {torch.__version__}. "
             f"Step time: median from step {a.start_iter} on (PowerSGD compresses from there), slowest rank.",
             "", "| hook | bytes/step (this rank) | compression | step ms | final loss | vs none |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in recs:
        name = r["hook"] + (f" ({r['bucket_cap_mib']} MiB buckets)" if "bucket_cap_mib" in r else "")
        lines.append(f"| {name} | {r['bytes_per_step'] / 2**20:.2f} MiB | {r['compression']:.1f}x | "
                     f"{r['step_ms']:.1f} | {r['final_loss']:.4f} | {r['final_loss'] / base:.3f} |")
    lines += ["", "bytes/step: what this rank put into collectives in the last step (all-reduce or all-gather input; "
              "top-k and int8 all-gather, so each rank receives world x that). `none` counts DDP's all-reduce of "
              "every gradient; compression is against a plain all-reduce of the same buckets."]
    return "\n".join(lines) + "\n"


def main_rank(a) -> None:
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    wanted = a.hooks.split(",") if a.hooks else None
    recs = []
    for name, make in configs(a).items():
        if wanted and name not in wanted:
            continue
        recs.append(run_one(name, make, a, rank, world, dev))
        if rank == 0:
            print(json.dumps(recs[-1]), flush=True)
    if rank == 0 and a.out_dir:
        os.makedirs(a.out_dir, exist_ok=True)
        stem = os.path.join(a.out_dir, f"{a.date}-{a.host}-{a.device}-hooks")
        with open(stem + ".jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
        with open(stem + ".md", "w") as f:
            f.write(markdown(recs, a, world))
        print(markdown(recs, a, world))
    dist.destroy_process_group()


def _spawned(rank, world, port, a):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    main_rank(a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="rustccl")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn when not under torchrun")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--start-iter", type=int, default=10, help="PowerSGD's start_iter; step times count from here")
    p.add_argument("--lr", type=float, default=4.0)
    p.add_argument("--hooks", default="", help="comma-separated subset of the configurations")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    p.add_argument("--host", default="devbox")
    a = p.parse_args()
    if "RANK" in os.environ:
        main_rank(a)
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_spawned, args=(a.world, port, a), nprocs=a.world)


if __name__ == "__main__":
    main()
