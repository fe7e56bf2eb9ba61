"""Rank-side body: every hook and the bucketer on tensors of one device over
the default group, against the same on CPU tensors over a gloo group.

With device "cuda" (default group nccl, or rustccl once it runs CUDA
collectives) this checks that the hooks are device-agnostic; with "cpu" it
checks rustccl against gloo."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

import rustccl.hooks as H
from refs import Checker
from rustccl.bucketing import GradientBucketer
from w_hooks import SHAPES, FakeBucket, grads, params_for


def _quant(pg):
    s = H.QuantState(pg)
    s.chunk_size = 64
    return s


CASES = [  # name, state factory (process group -> state), hook, tolerance relative to max|result|
    ("allreduce", lambda pg: pg, H.allreduce_hook, 1e-6),
    ("fp16", H.CommState, H.fp16_compress_hook, 2e-3),
    ("bf16", H.CommState, H.bf16_compress_hook, 2e-2),
    ("top-k", lambda pg: H.TopKState(pg, ratio=0.1), H.topk_hook, 1e-5),
    ("int8", _quant, H.int8_hook, 1e-5),
    ("PowerSGD", lambda pg: H.PowerSGDState(pg, start_iter=1, matrix_approximation_rank=2), H.powersgd_hook, 1e-3),
]


def device_parity(rank: int, world: int, device: str) -> tuple[int, list[str]]:
    torch.set_num_threads(1)
    c = Checker(rank)
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    gloo = dist.new_group(backend="gloo")
    p_cpu = params_for(SHAPES)
    p_dev = [nn.Parameter(p.detach().to(dev)) for p in p_cpu]
    for name, make, hook, tol in CASES:
        ref, st = make(gloo), make(None)
        for step in range(4):
            want = hook(ref, FakeBucket(grads(rank, step), p_cpu)).wait()
            got = hook(st, FakeBucket([g.to(dev) for g in grads(rank, step)], p_dev)).wait()
            d = (got.cpu() - want).abs().max().item()
            c.true(f"{name} step {step} on {dev.type}: {d:.3g} from CPU/gloo",
                   got.device == dev and d <= tol * max(1.0, want.abs().max().item()))
        if isinstance(st, H.CommState):
            c.true(f"{name}: same bytes counted", st.bytes_sent == ref.bytes_sent)
            restored = make(None)
            restored.load_state_dict(st.state_dict())
            fresh_params = [nn.Parameter(p.detach().clone()) for p in p_dev]
            a = hook(st, FakeBucket([g.to(dev) for g in grads(rank, 9)], p_dev)).wait()
            b = hook(restored, FakeBucket([g.to(dev) for g in grads(rank, 9)], fresh_params)).wait()
            c.true(f"{name}: restored state gives the identical step on {dev.type}", torch.equal(a, b))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).to(dev)
    twin = copy.deepcopy(model)
    bucketer = GradientBucketer(model, bucket_cap_mb=0.01)
    measured = GradientBucketer(copy.deepcopy(model))
    c.true(f"bucket size measured on {dev.type}: {measured}", measured.bucket_cap_bytes > 0)
    ddp = nn.parallel.DistributedDataParallel(twin, device_ids=[rank] if dev.type == "cuda" else None)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank)).to(dev)
    model(x).pow(2).mean().backward()
    bucketer.wait()
    ddp(x).pow(2).mean().backward()
    d = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), twin.parameters()))
    c.true(f"bucketer = DDP on {dev.type} ({d:.3g})", d <= 1e-6)
    return c.count, c.failures
