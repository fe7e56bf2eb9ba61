"""The benchmarked operations: buffers, one call, and the ``--check`` test.

Every op goes through the public ``torch.distributed`` API with synchronous
calls, as a user would call it:

==============  ==============================================================
all_reduce      ``all_reduce(x)`` (SUM, in place)
all_gather      ``all_gather_into_tensor(out[count*n], x[count])``
reduce_scatter  ``reduce_scatter_tensor(out[count/n], x[count])`` (SUM)
broadcast       ``broadcast(x, src=0)``
all_to_all      ``all_to_all_single(out[count], x[count])`` (even splits)
reduce          ``reduce(x, dst=0)`` (SUM)
gather          ``gather(x[count], gather_list=n x [count] on rank 0, dst=0)``
scatter         ``scatter(out[count/n], scatter_list=n x [count/n] on rank 0, src=0)``
send_recv       pairs 0<->1, 2<->3, ...: ping-pong of ``send``/``recv`` of x
==============  ==============================================================

Timed buffers are filled with ones, as in the anchors (all_reduce in place
doubles the values each call; harmless for float32 over a few dozen calls).

``--check`` runs each op once more on separate buffers filled with small
rank-dependent integers (exact in every supported dtype, also float16 and
bfloat16 for up to 16 ranks) and compares the result bit for bit with the
value computed locally. Mismatches come back as readable strings.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8,
    "int32": torch.int32, "int64": torch.int64,
}


def messages_per_iter(op: str) -> int:
    """send_recv's timed iteration is a ping-pong: two one-way messages."""
    return 2 if op == "send_recv" else 1


def peer(rank: int, world: int) -> int | None:
    """send_recv partner (rank ^ 1), or None for the odd one out."""
    p = rank ^ 1
    return p if p < world else None


def _send_recv(buf, rank: int, world: int, group=None):
    p = peer(rank, world)
    if p is None:
        return lambda: None
    if rank % 2 == 0:
        def fn():
            dist.send(buf, p, group=group)
            dist.recv(buf, p, group=group)
    else:
        def fn():
            dist.recv(buf, p, group=group)
            dist.send(buf, p, group=group)
    return fn


def timed_call(op: str, count: int, dtype, device, rank: int, world: int, group=None):
    """The zero-argument callable issuing one call of ``op`` on ones-filled
    buffers of ``count`` elements (buffers live in the closure), in
    ``group`` (default: the default group; it spans every rank)."""
    x = torch.ones(count, dtype=dtype, device=device)
    g = group
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=g)
    if op == "all_gather":
        out = torch.empty(count * world, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(out, x, group=g)
    if op == "reduce_scatter":
        out = torch.empty(count // world, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, x, group=g)
    if op == "broadcast":
        return lambda: dist.broadcast(x, 0, group=g)
    if op == "all_to_all":
        out = torch.empty(count, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, x, group=g)
    if op == "reduce":
        return lambda: dist.reduce(x, 0, group=g)
    if op == "gather":
        outs = [torch.empty(count, dtype=dtype, device=device) for _ in range(world)] if rank == 0 else None
        return lambda: dist.gather(x, outs, 0, group=g)
    if op == "scatter":
        out = torch.empty(count // world, dtype=dtype, device=device)
        ins = list(x.chunk(world)) if rank == 0 else None
        return lambda: dist.scatter(out, ins, 0, group=g)
    if op == "send_recv":
        return _send_recv(x, rank, world, g)
    raise ValueError(f"unknown op {op!r}")


# --- --check -----------------------------------------------------------------

def pattern(rank: int, count: int, dtype, device="cpu"):
    """Rank r's input: (i % 5) + r + 1, small integers exact in any dtype."""
    return ((torch.arange(count, device=device) % 5) + rank + 1).to(dtype)


def a2a_pattern(rank: int, world: int, count: int, dtype, device="cpu"):
    """Rank r's all_to_all input: chunk j holds ((r*n + j) % 97) + (i % 3),
    so every (source, destination) pair has its own values."""
    chunk = count // world
    i = torch.arange(chunk, device=device) % 3
    return torch.cat([((rank * world + j) % 97) + i for j in range(world)]).to(dtype)


def expected(op: str, rank: int, world: int, count: int, dtype, device="cpu"):
    """What ``op`` must leave in rank's output buffer for the check inputs
    (reductions summed in ``dtype``, so integer wrap-around matches too)."""
    if op == "all_reduce":
        return sum(pattern(r, count, dtype, device) for r in range(world))
    if op == "all_gather":
        return torch.cat([pattern(r, count, dtype, device) for r in range(world)])
    if op == "reduce_scatter":
        c = count // world
        return sum(pattern(r, count, dtype, device)[rank * c:(rank + 1) * c] for r in range(world))
    if op == "broadcast":
        return pattern(0, count, dtype, device)
    if op == "all_to_all":
        c = count // world
        return torch.cat([a2a_pattern(j, world, count, dtype, device)[rank * c:(rank + 1) * c] for j in range(world)])
    if op == "reduce":
        # non-root buffers are unspecified (gloo uses them as scratch)
        return sum(pattern(r, count, dtype, device) for r in range(world)) if rank == 0 else None
    if op == "gather":
        return torch.cat([pattern(r, count, dtype, device) for r in range(world)]) if rank == 0 else None
    if op == "scatter":
        c = count // world
        return pattern(0, count, dtype, device)[rank * c:(rank + 1) * c]
    if op == "send_recv":
        p = peer(rank, world)
        return None if p is None else pattern(p, count, dtype, device)
    raise ValueError(f"unknown op {op!r}")


def compare(what: str, got, want) -> list[str]:
    """[] when equal bit for bit, else one line naming the first difference."""
    if got.shape != want.shape:
        return [f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"]
    bad = (got != want) & ~(torch.isnan(got) & torch.isnan(want)) if got.is_floating_point() else got != want
    if not bool(bad.any()):
        return []
    idx = bad.nonzero()[0].item()
    return [f"{what}: {int(bad.sum())} of {got.numel()} elements differ; "
            f"first at [{idx}]: got {got[idx].item()}, expected {want[idx].item()}"]


def check(op: str, count: int, dtype, device, rank: int, world: int, group=None) -> list[str]:
    """Runs ``op`` once on check inputs (in ``group``); returns this rank's
    mismatches."""
    g = group
    what = f"rank {rank}: {op} count={count} {str(dtype).replace('torch.', '')}"
    if op == "send_recv":
        p = peer(rank, world)
        if p is None:
            return []
        mine = pattern(rank, count, dtype, device)
        got = torch.zeros(count, dtype=dtype, device=device)
        if rank % 2 == 0:
            dist.send(mine, p, group=g)
            dist.recv(got, p, group=g)
        else:
            dist.recv(got, p, group=g)
            dist.send(mine, p, group=g)
        return compare(what, got.cpu(), expected(op, rank, world, count, dtype))
    if op == "all_to_all":
        x = a2a_pattern(rank, world, count, dtype, device)
    else:
        x = pattern(rank, count, dtype, device)
    if op == "all_reduce" or op == "broadcast":
        out = x
        dist.all_reduce(x, group=g) if op == "all_reduce" else dist.broadcast(x, 0, group=g)
    elif op == "all_gather":
        out = torch.zeros(count * world, dtype=dtype, device=device)
        dist.all_gather_into_tensor(out, x, group=g)
    elif op == "reduce_scatter":
        out = torch.zeros(count // world, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(out, x, group=g)
    elif op == "all_to_all":
        out = torch.zeros(count, dtype=dtype, device=device)
        dist.all_to_all_single(out, x, group=g)
    elif op == "reduce":
        out = x
        dist.reduce(x, 0, group=g)
    elif op == "gather":
        outs = [torch.zeros(count, dtype=dtype, device=device) for _ in range(world)] if rank == 0 else None
        dist.gather(x, outs, 0, group=g)
        out = torch.cat(outs) if rank == 0 else None
    elif op == "scatter":
        out = torch.zeros(count // world, dtype=dtype, device=device)
        dist.scatter(out, list(x.chunk(world)) if rank == 0 else None, 0, group=g)
    else:
        raise ValueError(f"unknown op {op!r}")
    want = expected(op, rank, world, count, dtype)
    if want is None:
        return []
    return compare(what, out.cpu(), want)
