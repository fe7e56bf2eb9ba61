"""The CUDA sweep: every backend's group alive in one process, timed
alternately, median of rounds (the anchors' ``ab_bench.py`` method).

Why not one group at a time (``sweep``) on GPUs: a GPU host's clocks,
NVLink traffic of other jobs and the host's own load drift by tens of
percent over a minute, so blocks run one after the other compare different
machines. Here the ranks create the first backend's group as the default
group and one ``new_group`` per other backend over the same ranks, then per
(op, size): ``warmup`` calls on each, and ``repeats`` rounds (at least 5 on
CUDA); each round times one loop of ``iters`` calls per backend, the order
of backends alternating from round to round. ``us`` is the median loop /
iters; ``us_max`` the slowest rank's median. Each backend's communicators
and buffers exist outside the timed loops (set up on the warm-ups). Rows
have the same fields as the sweep's, plus ``method: "ab"`` and
``rounds_us`` (every round's time per call, rank 0), so the spread is in
the file.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

from . import metrics, ops

MIN_ROUNDS = 5


def _loop(fn, iters: int, device, group) -> float:
    torch.cuda.synchronize(device)
    dist.barrier(group=group)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _slowest(value: float, device, group) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _rounds(fns: dict, iters: int, rounds: int, device, group) -> dict[str, list[float]]:
    """Seconds per loop, per backend, backends alternating their order."""
    names = list(fns)
    out = {b: [] for b in names}
    for r in range(rounds):
        for b in names if r % 2 == 0 else names[::-1]:
            out[b].append(_loop(fns[b], iters, device, group))
    return out


def run_op(cfg, op: str, groups: dict, rank: int, world: int, device, progress) -> tuple[list[dict], list[str]]:
    dtype = ops.DTYPES[cfg.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    rounds = max(cfg.repeats, MIN_ROUNDS)
    sync_group = groups[cfg.backends[0]]
    rows, mismatches = [], []
    for size in metrics.sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor):
        count = metrics.element_count(size, itemsize, world)
        nbytes = metrics.reported_bytes(op, count, itemsize, world)
        progress.update(f"{op} {metrics.human_bytes(nbytes)}")
        iters, warmup = metrics.effective_iters(device.type, nbytes, cfg.iters, cfg.warmup)
        if cfg.check:
            for b, g in groups.items():
                mismatches += [f"{b}: {m}" for m in ops.check(op, count, dtype, device, rank, world, group=g)]
        fns = {b: ops.timed_call(op, count, dtype, device, rank, world, group=g) for b, g in groups.items()}
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        loops = _rounds(fns, iters, rounds, device, sync_group)
        del fns
        for b, g in groups.items():
            per_call = [s / iters / ops.messages_per_iter(op) for s in loops[b]]
            secs = statistics.median(per_call)
            algbw, busbw = metrics.bandwidths(op, nbytes, secs, world)
            rows.append({"kind": "result", "backend": b, "device": device.type, "world": world, "op": op,
                         "dtype": cfg.dtype, "size": size, "bytes": nbytes, "count": count, "us": secs * 1e6,
                         "us_max": _slowest(secs, device, g) * 1e6, "algbw_GBps": algbw, "busbw_GBps": busbw,
                         "iters": iters, "warmup": warmup, "repeats": rounds, "method": "ab",
                         "rounds_us": [round(x * 1e6, 2) for x in per_call]})
        for _ in groups:
            progress.advance()
    return rows, mismatches


def run_ddp(cfg, groups: dict, rank: int, world: int, device, progress) -> list[dict]:
    """The toy DDP step (see sweep.run_ddp) with one DDP model per backend,
    steps timed in alternating rounds."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .sweep import toy_model

    progress.update(f"ddp_toy_step SIZE={cfg.ddp_size}")
    steps = {}
    for b, g in groups.items():
        torch.manual_seed(0)
        ddp = DDP(toy_model(cfg.ddp_size).to(device), device_ids=[device.index], bucket_cap_mb=25, process_group=g)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        gen = torch.Generator(device=device).manual_seed(1 + rank)
        x = torch.randn(cfg.ddp_batch, cfg.ddp_size, device=device, generator=gen)
        y = torch.randn(cfg.ddp_batch, cfg.ddp_size, device=device, generator=gen)

        def step(ddp=ddp, opt=opt, x=x, y=y):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()

        for _ in range(3):
            step()
        steps[b] = step
    rounds = max(cfg.repeats, MIN_ROUNDS)
    loops = _rounds(steps, cfg.ddp_steps, rounds, device, groups[cfg.backends[0]])
    rows = []
    for b, g in groups.items():
        per_step = [s / cfg.ddp_steps * 1e3 for s in loops[b]]
        ms = statistics.median(per_step)
        rows.append({"kind": "result", "backend": b, "device": device.type, "world": world, "op": "ddp_toy_step",
                     "dtype": "float32", "batch": cfg.ddp_batch, "model_size": cfg.ddp_size, "steps": cfg.ddp_steps,
                     "repeats": rounds, "method": "ab", "ms": ms, "ms_max": _slowest(ms, device, g),
                     "rounds_ms": [round(x, 3) for x in per_step]})
    for _ in groups:
        progress.advance()
    return rows


def run_all(cfg, store, rank: int, world: int, device, progress) -> tuple[list[dict], list[str], list[str]]:
    """Every op (then the DDP step) with all backends' groups alive."""
    rows, mismatches, errors = [], [], []
    first, *others = cfg.backends
    dist.init_process_group(backend=first, store=PrefixStore("rustccl-bench/ab", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=cfg.timeout), device_id=device)
    try:
        groups = {first: dist.group.WORLD}
        for b in others:
            groups[b] = dist.new_group(backend=b, device_id=device)
        for op in cfg.ops + (["ddp_toy_step"] if cfg.ddp else []):
            done_before = progress.done
            try:
                if op == "ddp_toy_step":
                    rows += run_ddp(cfg, groups, rank, world, device, progress)
                else:
                    r, m = run_op(cfg, op, groups, rank, world, device, progress)
                    rows += r
                    mismatches += m
            except Exception as e:  # noqa: BLE001 - one failing op must not end the sweep
                msg = f"{op}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                errors.append(f"rank {rank}: {msg}")
                rows.append({"kind": "error", "backend": ",".join(cfg.backends), "device": device.type,
                             "world": world, "op": op, "dtype": cfg.dtype, "error": msg})
                units = len(groups) * (1 if op == "ddp_toy_step" else len(metrics.sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)))
                progress.advance(units - (progress.done - done_before))
    finally:
        dist.destroy_process_group()
    return rows, mismatches, errors
