"""The ``--method blocks`` sweep: one block per (op, backend), each in its
own process group (the default method is A/B, see ``ab``).

Fairness between backends
-------------------------
Only one backend is alive at a time. For every block the ranks create a
fresh default process group of that backend (``init_process_group`` with a
``PrefixStore`` of one shared rendezvous store, so no port is reused), run
all sizes of one op, and destroy it. No idle group of the other backend
keeps threads, sockets or GPU buffers around while one is measured, each
backend pays its own connection setup outside the timed region, and a
backend that fails an op leaves a broken group behind only for that block.
Blocks are interleaved op by op, and the backend order alternates between
ops (A B, B A, A B, ...), so slow drift of the machine (other load,
thermals) does not systematically favour the backend that runs first.

Timing (as the anchors)
-----------------------
Per (op, size): ``warmup`` calls, device sync, ``barrier``, device sync,
then ``iters`` calls issued back to back (synchronous API) and one device
sync; ``us`` = elapsed host time / iters (/ 2 for send_recv, see
metrics). ``us`` is rank 0's time, like the anchors (the median of the
rounds, ``us_min`` / ``us_max`` the fastest and slowest); ``us_slowest_rank``
is the slowest rank's (an extra all_reduce MAX after the timed loop). ``--check``
runs before the warm-ups, on separate buffers.

``--repeats R`` (default 1, the anchors' single loop) runs the timed loop R
times (barrier before each, warm-ups only before the first) and reports the
median loop: on a small, shared machine one loop of 20 calls can catch a
millisecond-scale scheduling stall that says nothing about the backend.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

from . import metrics, ops


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loop(fn, iters: int, warmup: int, device: torch.device, group=None) -> float:
    """Seconds for ``iters`` back-to-back calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    dist.barrier(group=group)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return time.perf_counter() - t0


def slowest(value: float, device: torch.device, group=None) -> float:
    """Max of ``value`` over the ranks (through the group under test)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


class Block:
    """One backend's process group for the lifetime of a ``with`` block."""

    def __init__(self, store, name: str, backend: str, rank: int, world: int, device, timeout_s: float):
        self.args = dict(backend=backend, store=PrefixStore(f"rustccl-bench/{name}", store), rank=rank,
                         world_size=world, timeout=timedelta(seconds=timeout_s))
        if device.type == "cuda":
            self.args["device_id"] = device

    def __enter__(self):
        dist.init_process_group(**self.args)
        return self

    def __exit__(self, *exc):
        if dist.is_initialized():
            dist.destroy_process_group()
        return False


def schedule(ops_: list[str], backends: list[str], ddp: bool) -> list[tuple[str, str]]:
    """(op, backend) blocks in run order: op by op, backend order alternating."""
    out = []
    for k, op in enumerate(ops_ + (["ddp_toy_step"] if ddp else [])):
        order = backends if k % 2 == 0 else backends[::-1]
        out += [(op, b) for b in order]
    return out


def run_op(cfg, op: str, backend: str, rank: int, world: int, device, progress) -> tuple[list[dict], list[str]]:
    """All sizes of ``op`` in the current group: result rows (meaningful on
    rank 0) and this rank's check mismatches."""
    dtype = ops.DTYPES[cfg.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows, mismatches = [], []
    for size in metrics.sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor):
        count = metrics.element_count(size, itemsize, world)
        nbytes = metrics.reported_bytes(op, count, itemsize, world)
        progress.update(f"{backend} {op} {metrics.human_bytes(nbytes)}")
        iters, warmup = metrics.effective_iters(device.type, nbytes, cfg.iters, cfg.warmup)
        if cfg.check:
            mismatches += ops.check(op, count, dtype, device, rank, world)
        fn = ops.timed_call(op, count, dtype, device, rank, world)
        loops = [time_loop(fn, iters, warmup if k == 0 else 0, device) for k in range(cfg.repeats)]
        per_call = [t / iters / ops.messages_per_iter(op) for t in loops]
        secs = statistics.median(per_call)
        del fn
        algbw, busbw = metrics.bandwidths(op, nbytes, secs, world)
        rows.append({"kind": "result", "backend": backend, "device": device.type, "world": world, "op": op,
                     "dtype": cfg.dtype, "size": size, "bytes": nbytes, "count": count, "us": secs * 1e6,
                     "us_min": min(per_call) * 1e6, "us_max": max(per_call) * 1e6,
                     "us_slowest_rank": slowest(secs, device) * 1e6, "algbw_GBps": algbw, "busbw_GBps": busbw,
                     "iters": iters, "warmup": warmup, "repeats": cfg.repeats, "method": "blocks"})
        progress.advance()
    return rows, mismatches


def toy_model(size: int):
    """The seeds' toy model: three Linear(SIZE, SIZE) with ReLU between."""
    import torch.nn as nn
    return nn.Sequential(nn.Linear(size, size), nn.ReLU(), nn.Linear(size, size), nn.ReLU(), nn.Linear(size, size))


def ddp_step(cfg, rank: int, device, group=None):
    """One DDP toy step of this rank in `group` (the anchors' model: MSE,
    SGD(lr=1e-3), bucket_cap_mb=25), after 3 untimed ones."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = toy_model(cfg.ddp_size).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=25,
              process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator(device=device).manual_seed(1 + rank)
    x = torch.randn(cfg.ddp_batch, cfg.ddp_size, device=device, generator=g)
    y = torch.randn(cfg.ddp_batch, cfg.ddp_size, device=device, generator=g)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    return step


def ddp_row(cfg, backend: str, world: int, device, group, loops: list, method: str) -> dict:
    """The result row of one backend's timed loops (seconds, ``ddp_steps``
    steps each)."""
    ms = statistics.median(loops) / cfg.ddp_steps * 1e3
    return {"kind": "result", "backend": backend, "device": device.type, "world": world, "op": "ddp_toy_step",
            "dtype": "float32", "bytes": 0, "batch": cfg.ddp_batch, "model_size": cfg.ddp_size, "steps": cfg.ddp_steps,
            "repeats": len(loops), "method": method, "ms": ms, "ms_max": slowest(ms, device, group),
            **step_spread(loops, cfg.ddp_steps)}


def step_spread(loops: list, steps: int) -> dict:
    """``us``, ``us_min``, ``us_max`` of a step from timed loops of ``steps``."""
    per = [t / steps * 1e6 for t in loops]
    return {"us": statistics.median(per), "us_min": min(per), "us_max": max(per)}


def run_ddp(cfg, backend: str, rank: int, world: int, device, progress, group=None) -> list[dict]:
    """The DDP toy step of one backend on its own: ``ddp_steps`` timed back
    to back, one sync (median of ``--repeats`` such loops). The A/B method
    alternates the backends' loops instead (``ab.run_steps``)."""
    progress.update(f"{backend} ddp_toy_step SIZE={cfg.ddp_size}")
    step = ddp_step(cfg, rank, device, group)
    loops = [time_loop(step, cfg.ddp_steps, 0, device, group) for _ in range(cfg.repeats)]
    progress.advance()
    return [ddp_row(cfg, backend, world, device, group, loops, "blocks")]


def run_all(cfg, store, rank: int, world: int, device, progress) -> tuple[list[dict], list[str], list[str]]:
    """Every block of the schedule; returns (rows, check mismatches, errors).
    A block that raises is recorded as an error and the sweep goes on with
    the next block (its group is destroyed; the next one is a fresh one).
    Only with ``--method blocks``; the default A/B method is ``ab``."""
    rows, mismatches, errors = [], [], []
    n_sizes = len(metrics.sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor))
    for i, (op, backend) in enumerate(schedule(cfg.ops, cfg.backends, cfg.ddp)):
        units = 1 if op == "ddp_toy_step" else n_sizes
        done_before = progress.done
        try:
            with Block(store, f"{i}-{op}-{backend}", backend, rank, world, device, cfg.timeout):
                if op == "ddp_toy_step":
                    rows += run_ddp(cfg, backend, rank, world, device, progress)
                else:
                    r, m = run_op(cfg, op, backend, rank, world, device, progress)
                    rows += r
                    mismatches += [f"{backend}: {s}" for s in m]
        except Exception as e:  # noqa: BLE001 - one failing block must not end the sweep
            msg = f"{backend} {op}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            errors.append(f"rank {rank}: {msg}")
            rows.append({"kind": "error", "backend": backend, "device": device.type, "world": world,
                         "op": op, "dtype": cfg.dtype, "error": msg})
            progress.advance(units - (progress.done - done_before))
    return rows, mismatches, errors
