"""Rank-side bodies of the CUDA tests (one GPU per rank, cuda:rank)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from refs import DTYPES, OPS, Checker, reference, supported, values

SIZES = [0, 1, 7, 1000, 300_011]


def _dev(rank: int) -> torch.device:
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def matrix(rank: int, world: int) -> tuple[int, list[str]]:
    """Every collective, reduce op and dtype on CUDA tensors vs local references."""
    dev = _dev(rank)
    c = Checker(rank)
    for dtype in DTYPES:
        for opname, op in OPS.items():
            if not supported(dtype, opname):
                continue
            for n in SIZES:
                x = values(dtype, opname, rank, n).to(dev)
                dist.all_reduce(x, op=op)
                want = reference(dtype, opname, [values(dtype, opname, r, n) for r in range(world)])
                c.eq(f"cuda all_reduce {dtype} {opname} n={n}", x.cpu(), want, opname)
    f32 = torch.float32
    for root in range(world):
        for n in (0, 5, 100_003):
            x = values(f32, "SUM", rank, n).to(dev)
            dist.broadcast(x, src=root)
            c.eq(f"cuda broadcast root={root} n={n}", x.cpu(), values(f32, "SUM", root, n))
            x = values(torch.int64, "MAX", rank, n).to(dev)
            mine = x.clone()
            dist.reduce(x, dst=root, op=dist.ReduceOp.MAX)
            want = reference(torch.int64, "MAX", [values(torch.int64, "MAX", r, n) for r in range(world)])
            c.eq(f"cuda reduce root={root} n={n}", x.cpu(), want if rank == root else mine.cpu())
            gl = [torch.empty(n, device=dev) for _ in range(world)] if rank == root else None
            dist.gather(values(f32, "SUM", rank, n).to(dev), gather_list=gl, dst=root)
            if gl is not None:
                for r in range(world):
                    c.eq(f"cuda gather root={root} from {r}", gl[r].cpu(), values(f32, "SUM", r, n))
            out = torch.empty(n, device=dev)
            sl = [values(f32, "SUM", r, n, salt=3).to(dev) for r in range(world)] if rank == root else None
            dist.scatter(out, scatter_list=sl, src=root)
            c.eq(f"cuda scatter root={root} n={n}", out.cpu(), values(f32, "SUM", rank, n, salt=3))
    for dtype in (torch.float16, torch.bfloat16, torch.int8, torch.bool):
        for n in (0, 1, 7, 4099):
            mine = values(dtype, "SUM", rank, n).to(dev)
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)]
            dist.all_gather(outs, mine)
            for r in range(world):
                c.eq(f"cuda all_gather {dtype} n={n} from {r}", outs[r].cpu(), values(dtype, "SUM", r, n))
            out = torch.empty(world * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, mine)
            c.eq(f"cuda all_gather_into_tensor {dtype} n={n}", out.cpu(), torch.cat([values(dtype, "SUM", r, n) for r in range(world)]))
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for opname in ("SUM", "AVG", "MIN"):
            for n in (0, 3, 5001):
                part = lambda s, d: values(dtype, opname, s * world + d, n)  # noqa: E731
                want = reference(dtype, opname, [part(s, rank) for s in range(world)])
                out = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter(out, [part(rank, d).to(dev) for d in range(world)], op=OPS[opname])
                c.eq(f"cuda reduce_scatter {dtype} {opname} n={n}", out.cpu(), want, opname)
                out = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(out, torch.cat([part(rank, d) for d in range(world)]).to(dev), op=OPS[opname])
                c.eq(f"cuda reduce_scatter_tensor {dtype} {opname} n={n}", out.cpu(), want, opname)
    rows = lambda s, d: (s + 1) * (d + 1) % 4  # noqa: E731
    blk = lambda s, d: torch.arange(rows(s, d) * 3, dtype=torch.float32).reshape(-1, 3) + 100 * s + 10 * d  # noqa: E731
    out = torch.empty(sum(rows(s, rank) for s in range(world)), 3, device=dev)
    dist.all_to_all_single(out, torch.cat([blk(rank, d) for d in range(world)]).to(dev),
                           output_split_sizes=[rows(s, rank) for s in range(world)],
                           input_split_sizes=[rows(rank, d) for d in range(world)])
    c.eq("cuda all_to_all_single uneven", out.cpu(), torch.cat([blk(s, rank) for s in range(world)]))
    outs = [torch.empty(rows(s, rank), 3, device=dev) for s in range(world)]
    dist.all_to_all(outs, [blk(rank, d).to(dev) for d in range(world)])
    for s in range(world):
        c.eq(f"cuda all_to_all list from {s}", outs[s].cpu(), blk(s, rank))
    ts = [values(f32, "SUM", rank, n, salt=n).to(dev) for n in (3, 0, 1000)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (3, 0, 1000)):
        c.eq(f"cuda all_reduce_coalesced n={n}", t.cpu(), reference(f32, "SUM", [values(f32, "SUM", r, n, salt=n) for r in range(world)]))
    dist.barrier()
    return c.count, c.failures


def semantics(rank: int, world: int) -> tuple[int, list[str]]:
    """Stream ordering, async work, futures, tensor lifetimes, p2p, groups,
    CPU and CUDA in one group, wrong-device errors, host-staged reductions."""
    dev = _dev(rank)
    c = Checker(rank)
    # point-to-point first: no group communicator yet, so a pair's is made
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if world >= 2:
        if rank in (0, 1):
            peer = 1 - rank
            t = torch.full((1000,), float(rank), device=dev)
            if rank == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                r_ = torch.empty(1000, device=dev)
                dist.recv(r_, peer)
                dist.send(t, peer)
                c.eq("cuda send/recv (pair communicator)", r_.cpu(), torch.zeros(1000))
            if rank == 0:
                c.eq("cuda recv back", t.cpu(), torch.ones(1000))
    # a producer kernel on a side stream; the collective must wait for it
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.empty(1 << 22, device=dev)
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time before the fill
        big.fill_(float(rank + 1))
        w = dist.all_reduce(big, async_op=True)
        w.wait()  # orders the side stream after the collective, host free
        total = big.sum()
    side.synchronize()
    c.eq("stream ordering", total.cpu(), torch.tensor(float(sum(range(1, world + 1)) * (1 << 22))))
    c.true("current stream restored", torch.cuda.current_stream() == torch.cuda.default_stream())
    # async on the default stream, wait, future.then
    xs = [torch.full((4096,), float(rank + k), device=dev) for k in range(8)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    fut = works[-1].get_future().then(lambda f: f.value()[0] * 2)
    for w in works:
        w.wait()
    for k, x in enumerate(xs):
        c.eq(f"async {k}", x.cpu(), torch.full((4096,), float(sum(r + k for r in range(world)))))
    c.eq("cuda future.then", fut.wait().cpu(), torch.full((4096,), 2.0 * sum(r + 7 for r in range(world))))
    torch.cuda.synchronize()
    c.true("is_completed after sync", all(w.is_completed() for w in works))
    # inputs held only by rustccl until the device has used them
    n = 1 << 20
    outs = []
    for k in range(4):
        out = torch.empty(world * n, device=dev)
        w = dist.all_gather_into_tensor(out, torch.full((n,), float(rank * 10 + k), device=dev), async_op=True)
        junk = [torch.full((n,), -1.0, device=dev) for _ in range(4)]  # would reuse a freed input block
        del junk
        outs.append((out, w, k))
    for out, w, k in outs:
        w.wait()
        want = torch.cat([torch.full((n,), float(r * 10 + k)) for r in range(world)])
        c.eq(f"input kept alive {k}", out.cpu(), want)
    # CPU and CUDA tensors in one group
    cpu = torch.full((10,), float(rank))
    dist.all_reduce(cpu)
    gpu = torch.full((10,), float(rank), device=dev)
    dist.all_reduce(gpu)
    c.eq("cpu in a cuda group", cpu, torch.full((10,), float(sum(range(world)))))
    c.eq("cuda after cpu", gpu.cpu(), torch.full((10,), float(sum(range(world)))))
    # reductions NCCL lacks go through host memory
    b = (torch.arange(16, dtype=torch.int32) * (rank + 1)).to(dev)
    dist.all_reduce(b, op=dist.ReduceOp.BXOR)
    want = reference(torch.int32, "BXOR", [torch.arange(16, dtype=torch.int32) * (r + 1) for r in range(world)])
    c.eq("cuda BXOR via host", b.cpu(), want)
    # non-contiguous CUDA output
    base = torch.zeros(64, 2, device=dev)
    view = base[:, 1]
    view.fill_(float(rank))
    dist.all_reduce(view)
    c.eq("cuda non-contiguous", base.cpu()[:, 1], torch.full((64,), float(sum(range(world)))))
    c.true("cuda non-contiguous leaves other column", bool((base[:, 0] == 0).all()))
    # batch_isend_irecv ring
    s1 = torch.full((7,), float(rank), device=dev)
    r1 = torch.empty(7, device=dev)
    ops = [dist.P2POp(dist.isend, s1, nxt), dist.P2POp(dist.irecv, r1, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    c.eq("cuda batch_isend_irecv", r1.cpu(), torch.full((7,), float(prv)))
    # subgroups get their own communicators
    g = dist.new_group(list(range(world - 1, -1, -1)))
    y = torch.full((3,), float(rank), device=dev)
    dist.all_reduce(y, group=g)
    c.eq("cuda subgroup", y.cpu(), torch.full((3,), float(sum(range(world)))))
    # wrong device: a tensor on another GPU
    if torch.cuda.device_count() > 1:
        other = torch.ones(2, device=torch.device("cuda", (rank + 1) % torch.cuda.device_count()))
        try:
            dist.all_reduce(other)
            c.true("wrong device raises", False)
        except RuntimeError as e:
            c.true(f"wrong device message: {e}", "rustccl all_reduce" in str(e) and "cuda:" in str(e))
    z = torch.ones(2, device=dev)
    dist.all_reduce(z)
    c.eq("group works after the error", z.cpu(), torch.full((2,), float(world)))
    dist.barrier()
    return c.count, c.failures


SIZE = 512


def ddp_parity(rank: int, world: int, steps: int) -> tuple[int, list[str]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _dev(rank)
    c = Checker(rank)
    nccl = dist.new_group(backend="nccl")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(SIZE, SIZE), nn.ReLU(), nn.Linear(SIZE, SIZE), nn.ReLU(), nn.Linear(SIZE, SIZE)).to(dev)
    d_r = DDP(copy.deepcopy(base), device_ids=[rank], bucket_cap_mb=1)
    d_n = DDP(copy.deepcopy(base), device_ids=[rank], process_group=nccl, bucket_cap_mb=1)
    o_r = torch.optim.SGD(d_r.parameters(), lr=0.01)
    o_n = torch.optim.SGD(d_n.parameters(), lr=0.01)
    for step in range(steps):
        g = torch.Generator(device=dev).manual_seed(100 * step + rank)
        x = torch.randn(64, SIZE, device=dev, generator=g)
        y = torch.randn(64, SIZE, device=dev, generator=g)
        for d, o in ((d_r, o_r), (d_n, o_n)):
            o.zero_grad()
            nn.functional.mse_loss(d(x), y).backward()
        for (name, p_r), p_n in zip(d_r.module.named_parameters(), d_n.module.parameters()):
            c.true(f"step {step} grad {name} allclose", torch.allclose(p_r.grad, p_n.grad, rtol=1e-4, atol=1e-6))
        o_r.step()
        o_n.step()
    return c.count, c.failures


def eager(rank: int, world: int) -> tuple[int, list[str]]:
    """Launched with init="none": init_process_group(device_id=...) creates
    the NCCL communicator before any collective."""
    import os

    import rustccl

    dev = _dev(rank)
    c = Checker(rank)
    dist.init_process_group("rustccl", device_id=dev, rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}")
    x = torch.full((5,), float(rank), device=dev)
    dist.all_reduce(x)
    c.eq("eager all_reduce", x.cpu(), torch.full((5,), float(sum(range(world)))))
    c.true("rustccl imported", rustccl.BACKEND_NAME == "rustccl")
    dist.destroy_process_group()
    return c.count, c.failures
