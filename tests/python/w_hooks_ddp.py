"""Rank-side bodies: DDP training with each rustccl hook on a small
regression task (a fixed random teacher network, each rank draws its own
batches), against uncompressed DDP and against gradients averaged locally
over every rank's batch; checkpoint and restore in the middle of training."""

from __future__ import annotations

import copy
import io

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import rustccl.hooks as H
from refs import Checker

IN, OUT, BATCH = 32, 8, 32

HOOKS = {
    "none": None,  # DDP's own all-reduce: the baseline
    "allreduce": lambda: (H.CommState(), H.allreduce_hook),
    "fp16": lambda: (H.CommState(), H.fp16_compress_hook),
    "bf16": lambda: (None, H.bf16_compress_hook),
    "powersgd": lambda: (H.PowerSGDState(matrix_approximation_rank=2, start_iter=10), H.powersgd_hook),
    "topk": lambda: (H.TopKState(ratio=0.01), H.topk_hook),
    "topk_no_ef": lambda: (H.TopKState(ratio=0.01, use_error_feedback=False), H.topk_hook),
    "int8": lambda: (H.QuantState(), H.int8_hook),
}


def teacher() -> nn.Module:
    g = torch.Generator().manual_seed(1234)
    t = nn.Sequential(nn.Linear(IN, 64), nn.Tanh(), nn.Linear(64, OUT))
    with torch.no_grad():
        for p in t.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (2 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.1))
    return t


def student() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, OUT))


def batch(t: nn.Module, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH, IN, generator=torch.Generator().manual_seed(100_000 * rank + step))
    with torch.no_grad():
        return x, t(x)


def eval_loss(model: nn.Module, t: nn.Module) -> float:
    x = torch.randn(2048, IN, generator=torch.Generator().manual_seed(999))
    with torch.no_grad():
        return F.mse_loss(model(x), t(x)).item()


def local_grads(model: nn.Module, t: nn.Module, world: int, step: int) -> list[list[torch.Tensor]]:
    """Every rank's gradients at `step`, computed here from its batch."""
    out = []
    for r in range(world):
        m = copy.deepcopy(model)
        m.zero_grad(set_to_none=True)
        x, y = batch(t, r, step)
        F.mse_loss(m(x), y).backward()
        out.append([p.grad for p in m.parameters()])
    return out


def make_ddp(model: nn.Module, make) -> tuple[DDP, object]:
    ddp = DDP(model, bucket_cap_mb=0.02)  # several buckets per step
    state = None
    if make is not None:
        state, hook = make()
        ddp.register_comm_hook(state, hook)
    return ddp, state


def train(c: Checker, name: str, rank: int, world: int, steps: int, lr: float) -> tuple[float, float]:
    t = teacher()
    model = student()
    ddp, state = make_ddp(model, HOOKS[name])
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    first = None
    for step in range(steps):
        x, y = batch(t, rank, step)
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        first = loss.item() if first is None else first
        # The first steps against the average computed here. int8 only at
        # step 0 (afterwards error feedback shifts it on purpose): within half
        # a quantisation step, i.e. the mean over ranks of max|g_r| / 254.
        checks = {"allreduce": 3, "fp16": 3, "int8": 1}.get(name, 0)
        if step < checks:
            per_rank = local_grads(model, t, world, step)
            want = [sum(gs) / world for gs in zip(*per_rank)]
            tol = {"allreduce": 1e-6 * max(w.abs().max().item() for w in want),
                   "fp16": 1e-3 * max(w.abs().max().item() for w in want),
                   "int8": sum(max(g.abs().max().item() for g in gs) for gs in per_rank) / world / 254}[name]
            for i, (p, w) in enumerate(zip(model.parameters(), want)):
                d = (p.grad - w).abs().max().item()
                c.true(f"{name} step {step} param {i}: DDP gradient = local average (max diff {d:.3g}, tol {tol:.3g})",
                       d <= tol)
        opt.step()
    if isinstance(state, H.CommState):
        c.true(f"{name}: bytes counted: {state}", state.bytes_sent > 0 and state.iter == steps)
    return first, eval_loss(model, t)


def convergence(rank: int, world: int, steps: int, lr: float) -> tuple[int, list[str], dict]:
    """Final evaluation loss of every hook (pytest judges them)."""
    torch.set_num_threads(1)  # ranks share two cores
    c = Checker(rank)
    losses = {name: train(c, name, rank, world, steps, lr) for name in HOOKS}
    return c.count, c.failures, losses


def checkpoint(rank: int, world: int, steps: int, lr: float) -> tuple[int, list[str]]:
    """Training with a stateful hook, saved after `steps` steps and restored
    into a new DDP model, optimizer and state: the next step must be
    identical to the one of the run that never stopped. (Not top-k: it
    selects per bucket, and a new DDP's first iteration groups parameters
    differently from the rebuilt buckets of a running one; its state's
    round trip is checked on fixed buckets in w_hooks.)"""
    torch.set_num_threads(1)
    c = Checker(rank)
    t = teacher()
    for name in ("powersgd", "int8"):
        model = student()
        make = HOOKS[name]
        if name == "powersgd":  # compress from step 2: the memory is in use at the save
            def make():
                return H.PowerSGDState(matrix_approximation_rank=2, start_iter=2), H.powersgd_hook
        ddp, state = make_ddp(model, make)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)

        def step(ddp, opt, k):
            x, y = batch(t, rank, k)
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()

        for k in range(steps):
            step(ddp, opt, k)
        blob = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, blob)
        step(ddp, opt, steps)
        blob.seek(0)
        ck = torch.load(blob, weights_only=True)
        model2 = student()
        model2.load_state_dict(ck["model"])
        ddp2, state2 = make_ddp(model2, make)
        state2.load_state_dict(ck["hook"])
        opt2 = torch.optim.SGD(ddp2.parameters(), lr=lr, momentum=0.9)
        opt2.load_state_dict(ck["opt"])
        step(ddp2, opt2, steps)
        same = all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
        c.true(f"{name}: restored training takes the identical step", same)
        c.true(f"{name}: restored counters", (state.iter, state.bytes_sent) == (state2.iter, state2.bytes_sent))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    c.true("replicas identical across ranks", all(torch.equal(everyone[0], e) for e in everyone))
    return c.count, c.failures


def torch_powersgd(rank: int, world: int, steps: int, lr: float) -> dict:
    """torch's own PowerSGD hook (ranks 1 and 4, error feedback, warm
    start, compressing from step 3) against DDP's plain all-reduce: the
    final evaluation loss of each (pytest compares them)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P

    torch.set_num_threads(1)
    t = teacher()
    out = {"untrained": eval_loss(student(), t)}
    for name, rank_k in (("none", None), ("powersgd1", 1), ("powersgd4", 4)):
        model = student()
        ddp = DDP(model, bucket_cap_mb=0.02)
        if rank_k is not None:
            state = P.PowerSGDState(process_group=None, matrix_approximation_rank=rank_k, start_powerSGD_iter=3,
                                    use_error_feedback=True, warm_start=True, min_compression_rate=0.5)
            ddp.register_comm_hook(state, P.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        for step in range(steps):
            x, y = batch(t, rank, step)
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()
        out[name] = eval_loss(model, t)
    return out
