"""Ranks of tests/python/test_compression.py: two simulated hosts
(RUSTCCL_HOST_ID), 2 ranks each, through torch.distributed."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import rustccl
import rustccl.hooks as H


def _init(rank, per_host=2):
    os.environ["RUSTCCL_HOST_ID"] = f"simhost{rank // per_host}"
    dist.init_process_group("rustccl", timeout=timedelta(seconds=60))


def _int8(x):
    """The engine's int8 codec in torch: scale max|block| / 127 per 256
    values, x * (127 / max) rounded half to even."""
    n = x.numel()
    xp = torch.cat([x, x.new_zeros(-n % 256)]).view(-1, 256)
    m = xp.abs().amax(dim=1, keepdim=True)
    inv = torch.where(m > 0, torch.tensor(127.0) / m, torch.zeros_like(m))
    q = torch.round(xp * inv).clamp(-127, 127)
    return (q * (m / 127.0)).view(-1)[:n]


def _inputs(r, n):
    g = torch.Generator().manual_seed(100 + r)
    return torch.randint(-400, 400, (n,), generator=g).float() * 0.25


def all_reduce(rank, world):
    _init(rank)
    out = {}
    gloo = dist.new_group(backend="gloo")
    n = 100_003
    xs = [_inputs(r, n) for r in range(world)]
    partials = [xs[0] + xs[1], xs[2] + xs[3]]  # exact: quarter-integers
    for codec, ref in (("int8", lambda p: _int8(p[0]) + _int8(p[1])),
                       ("bf16", lambda p: p[0].bfloat16().float() + p[1].bfloat16().float()),
                       ("fp16", lambda p: p[0].half().float() + p[1].half().float())):
        rustccl.set_compression(None, codec, error_feedback=False)
        assert rustccl.compression() == (codec, False)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            x = xs[rank].clone()
            dist.all_reduce(x, op=op)
            want = ref(partials)
            if op == dist.ReduceOp.AVG:
                want = want / world
            out[f"{codec}_{op}_equal_reference"] = bool(torch.equal(x, want))
            everyone = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(everyone, x, group=gloo)
            out[f"{codec}_{op}_ranks_agree"] = all(torch.equal(e.view(torch.int32), x.view(torch.int32)) for e in everyone)
        s = rustccl.stats()["ops"]["all_reduce"]
        out[f"{codec}_stats"] = (s["algorithm"], s["codec"])
    # Fallbacks: exact for MAX and for integers, with int8 on.
    rustccl.set_compression(None, "int8")
    x = xs[rank].clone()
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    out["max_exact"] = bool(torch.equal(x, torch.stack(xs).amax(dim=0)))
    i = (xs[rank] * 4).int()
    dist.all_reduce(i)
    out["int_exact"] = bool(torch.equal(i, sum((v * 4).int() for v in xs)))
    rustccl.set_compression(None, None)
    assert rustccl.compression() is None
    x = xs[rank].clone()
    dist.all_reduce(x)
    out["off_exact"] = bool(torch.equal(x, partials[0] + partials[1]))
    try:
        rustccl.set_compression(None, "zstd")
        out["bad_codec"] = "accepted"
    except ValueError as e:
        out["bad_codec"] = str(e)
    checks = {k: v for k, v in out.items() if isinstance(v, bool)}
    return len(checks), [f"rank {rank}: {k}" for k, v in checks.items() if not v], out


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))


def ddp(rank, world, steps):
    """The same training with DDP's own all-reduce and with the engine hook."""
    _init(rank)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(64, 64, generator=g) / 8
    losses, bytes_between = {}, {}
    for name in ("none", "int8", "bf16"):
        model = _model()
        d = DDP(model, bucket_cap_mb=0.01)  # several buckets
        if name != "none":
            d.register_comm_hook(H.CommState(), H.engine_compression(name))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1000 + rank)
        rustccl.reset_stats()
        for _ in range(steps):
            x = torch.randn(32, 64, generator=gen)
            opt.zero_grad()
            F.mse_loss(d(x), x @ teacher).backward()
            opt.step()
        xe = torch.randn(512, 64, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            losses[name] = F.mse_loss(model(xe), xe @ teacher).item()
        s = rustccl.stats()["ops"]["all_reduce"]
        bytes_between[name] = (s["between_hosts_bytes"], s["bytes"], s["codec"])
    params = [p.detach().clone() for p in model.parameters()]
    out = {"losses": losses, "between": bytes_between, "params": [p.sum().item() for p in params]}
    bad = [f"rank {rank}: loss {k} = {v}" for k, v in losses.items() if not v == v or v > 1e6]
    return len(losses), bad, out
