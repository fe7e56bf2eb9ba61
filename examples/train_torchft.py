"""Fault-tolerant DDP with torchft over rustccl: replicas that die and come back.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 &
    export TORCHFT_LIGHTHOUSE=http://localhost:29510
    python examples/train_torchft.py --replica-id 0 &
    python examples/train_torchft.py --replica-id 1 &

Each process is one replica (a replica of several ranks runs this under
torchrun: torchft's Manager takes its rank and store from torchrun's
environment). torchft's Lighthouse forms a quorum of the live replicas at
every step; the replicas average their gradients over rustccl's process
group (``rustccl.torchft.ProcessGroupRustccl``), which torchft reconfigures
whenever the quorum changes. Kill a replica mid-training: the others skip
the step whose gradient exchange failed and train on; start it again with
the same ``--replica-id`` and it joins the next quorum, takes the model and
optimizer from a live replica (torchft's healing) and trains in step with
them.

The model is the seeds' toy model (three Linear(SIZE, SIZE) layers), each
replica on its own fixed batch. ``--log FILE`` appends one JSON line per
committed step: the step, the wall time, the loss and a checksum of the
parameters, so that replicas can be compared step by step.
``--backend gloo`` runs torchft's own ``ProcessGroupGloo`` instead, for A/B.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
from torch import nn, optim
from torchft import DistributedDataParallel, Manager, Optimizer
from torchft.process_group import ProcessGroupGloo

from rustccl.torchft import ProcessGroupRustccl

SIZE = 256


def model() -> nn.Module:
    torch.manual_seed(0)  # every replica starts from the same weights
    return nn.Sequential(nn.Linear(SIZE, SIZE), nn.ReLU(), nn.Linear(SIZE, SIZE), nn.ReLU(), nn.Linear(SIZE, SIZE))


def checksum(m: nn.Module) -> float:
    """A sum that differs when any parameter does (weighted by position)."""
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).double() for p in m.parameters()])
        return float((flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64).sin()).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replica-id", type=int, required=True)
    ap.add_argument("--steps", type=int, default=100, help="train until this committed step")
    ap.add_argument("--min-replicas", type=int, default=1, help="a step needs this many replicas")
    ap.add_argument("--step-ms", type=float, default=0.0, help="extra work per step (sleep), to stretch a run")
    ap.add_argument("--backend", choices=["rustccl", "gloo"], default="rustccl")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds: collectives and quorums")
    ap.add_argument("--log", help="append one JSON line per committed step to this file")
    args = ap.parse_args()

    timeout = timedelta(seconds=args.timeout)
    pg = ProcessGroupRustccl(timeout=timeout) if args.backend == "rustccl" else ProcessGroupGloo(timeout=timeout)
    net = model()
    opt = optim.AdamW(net.parameters(), lr=1e-3)

    # A replica of one rank has no torchrun around it: it hosts its own store.
    if "MASTER_ADDR" not in os.environ:
        store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(store.port), RANK="0", WORLD_SIZE="1")

    manager = Manager(
        pg=pg,
        min_replica_size=args.min_replicas,
        load_state_dict=lambda sd: (net.load_state_dict(sd["model"]), opt.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": net.state_dict(), "optim": opt.state_dict()},
        replica_id=f"train_torchft_{args.replica_id}",
        timeout=timeout,
        quorum_timeout=timeout,
    )
    ddp = DistributedDataParallel(manager, net)
    optimizer = Optimizer(manager, opt)

    g = torch.Generator().manual_seed(1000 + args.replica_id)
    x, y = torch.randn(64, SIZE, generator=g), torch.randn(64, SIZE, generator=g)
    log = open(args.log, "a") if args.log else None
    try:
        while manager.current_step() < args.steps:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            # torchft's Optimizer.step in the open: step only if every
            # replica's gradient exchange of this step succeeded
            if not manager.should_commit():
                continue
            opt.step()
            if log:
                rec = {
                    "replica": args.replica_id,
                    "pid": os.getpid(),
                    "step": manager.current_step(),
                    "time": time.time(),
                    "loss": loss.item(),
                    "participants": manager.num_participants(),
                    "checksum": checksum(net),
                }
                log.write(json.dumps(rec) + "\n")
                log.flush()
    finally:
        manager.shutdown(wait=False)
    print(f"replica {args.replica_id}: {manager.current_step()} steps, loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
