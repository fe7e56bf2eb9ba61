"""The seeds' toy DDP model trained over rustccl on CPU.

    torchrun --nproc_per_node=2 examples/train_ddp.py            # rustccl
    torchrun --nproc_per_node=2 examples/train_ddp.py --backend gloo

Three Linear(SIZE, SIZE) layers with ReLU, MSE loss, SGD; each rank fits its
own fixed batch (so the loss goes down), DDP averages the gradients. Prints
the loss (averaged over ranks) and the step time on rank 0.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rustccl  # noqa: F401  (registers the "rustccl" backend)


class ToyModel(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.net1 = nn.Linear(size, size)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(size, size)
        self.net3 = nn.Linear(size, size)

    def forward(self, x):
        return self.net3(self.relu(self.net2(self.relu(self.net1(x)))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="rustccl")
    p.add_argument("--size", type=int, default=4000, help="SIZE of the Linear(SIZE, SIZE) layers (seeds: 4000)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=4.0)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    a = p.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = ToyModel(a.size)
    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr)
    loss_fn = nn.MSELoss()
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(a.batch, a.size, generator=g)
    y = torch.randn(a.batch, a.size, generator=g) * 0.1

    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"backend={a.backend} world={world} params={params / 1e6:.1f}M batch={a.batch}/rank", flush=True)
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        step_ms = (time.perf_counter() - t0) * 1e3
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.SUM)
        if rank == 0:
            print(f"step {step:3d} loss {avg.item() / world:.6f} ({step_ms:.0f} ms)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
