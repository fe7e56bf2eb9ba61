"""A DDP job that survives a dead rank: rustccl's ``dist.shrink_group`` on CPU.

    torchrun --nproc_per_node=4 examples/train_survive.py --fail-rank 3 --fail-step 10

The seeds' toy model (three Linear(SIZE, SIZE) layers) trained with DDP, each
rank on its own fixed batch. At step --fail-step, rank --fail-rank vanishes.
The survivors' next collective fails within about 0.1 s; each asks rustccl
which ranks it lost (``rustccl.failed_ranks()``), calls
``dist.shrink_group(those)`` (the shrunk group becomes the default group),
rebuilds DDP over it from the replica every survivor holds, redoes the step
that failed and trains to the end. Rank 0 prints the loss of every step and
the recovery time: from the death to the first completed step on the shrunk
group.

How the rank vanishes (``--how``): ``exit`` (the default) ends the process at
once with ``os._exit(0)``, closing its sockets as a crash would; ``sigkill``
kills it. Under torchrun use ``exit``: torchrun treats any worker that dies
of a signal as a failed job and stops every other worker.

The two comparisons the benchmark (``benchmarks/shrink_recovery.py``) makes:

- ``--save-state FILE``: the survivors' rank 0 saves the model and optimizer
  right after the shrink; ``--resume FILE`` starts a job of the survivors'
  size from that state, so its final loss can be compared with the survivors'.
- ``--mode restart``: what a user has today. Every rank checkpoints each step;
  the failing rank SIGKILLs itself, and ``torchrun --max-restarts=1`` restarts
  the whole job, which resumes from the checkpoint.

``--result FILE`` (rank 0) writes the losses and timings as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rustccl
from train_ddp import ToyModel  # the seeds' toy model (this script's folder is on sys.path)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1024, help="SIZE of the Linear(SIZE, SIZE) layers")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=4.0)
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that vanishes (-1: none)")
    p.add_argument("--fail-step", type=int, default=10)
    p.add_argument("--how", choices=["exit", "sigkill"], default="exit")
    p.add_argument("--mode", choices=["shrink", "restart"], default="shrink")
    p.add_argument("--workdir", default=os.environ.get("SURVIVE_DIR", "/tmp/rustccl-survive"),
                   help="where the failing rank notes the time it died (and restart mode keeps its checkpoint)")
    p.add_argument("--save-state", default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--result", default=None)
    return p.parse_args()


def avg_loss(loss: torch.Tensor) -> float:
    t = loss.detach().clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def main() -> None:
    a = parse()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.makedirs(a.workdir, exist_ok=True)
    dist.init_process_group("rustccl")
    rank = dist.get_rank()
    first_world = dist.get_world_size()

    torch.manual_seed(0)
    model = ToyModel(a.size)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    start = 0
    ckpt = a.resume or (os.path.join(a.workdir, "ckpt.pt") if a.mode == "restart" else None)
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    restarted = a.mode == "restart" and start > 0
    ddp = DDP(model)
    loss_fn = nn.MSELoss()
    # Each rank's data follows its rank at the start (survivors keep theirs).
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(a.batch, a.size, generator=g)
    y = torch.randn(a.batch, a.size, generator=g) * 0.1
    died_file = os.path.join(a.workdir, "died_at")
    losses: dict[int, float] = {}
    timing: dict[str, float] = {}

    step = start
    while step < a.steps:
        if step == a.fail_step and rank == a.fail_rank and not restarted:
            with open(died_file, "w") as f:
                f.write(repr(time.time()))
            if a.how == "sigkill" or a.mode == "restart":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(0)
        try:
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            losses[step] = avg_loss(loss)
        except RuntimeError as e:
            # A rank died: the step's gradients never got averaged and
            # opt.step() did not run, so every survivor still holds the
            # same replica. Leave the dead rank(s) out and redo the step.
            timing["error_at"] = time.time()
            dead = rustccl.failed_ranks()
            if not dead:
                raise
            if rank == 0:
                print(f"step {step}: {type(e).__name__}: lost rank(s) {dead}; shrinking", flush=True)
            t1 = time.perf_counter()
            del ddp
            dist.shrink_group(dead)
            ddp = DDP(model)
            timing["shrink_and_rebuild_s"] = time.perf_counter() - t1
            if a.save_state and dist.get_rank() == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, a.save_state)
            timing["recovered_step"] = step
            continue
        if ("error_at" in timing or restarted) and "first_step_after" not in timing:
            timing["first_step_after"] = time.time()
        if a.mode == "restart" and dist.get_rank() == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)
        if dist.get_rank() == 0:
            print(f"step {step:3d} world {dist.get_world_size()} loss {losses[step]:.6f} "
                  f"({(time.perf_counter() - t0) * 1e3:.0f} ms)", flush=True)
        step += 1

    if dist.get_rank() == 0:
        if os.path.exists(died_file) and "first_step_after" in timing:
            with open(died_file) as f:
                timing["recovery_s"] = timing["first_step_after"] - float(f.read())
            print(f"recovered in {timing['recovery_s']:.3f} s (death -> first completed step on "
                  f"{dist.get_world_size()} ranks)", flush=True)
        if a.result:
            with open(a.result, "w") as f:
                json.dump({"mode": a.mode, "first_world": first_world, "world": dist.get_world_size(),
                           "start": start, "losses": losses, "final_loss": losses.get(a.steps - 1),
                           **timing}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
