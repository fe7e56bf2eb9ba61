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
    # CUDA futures are made on demand: one asked for after later collectives
    # (which queue more work on the same stream) still yields the result,
    # and so does the future of a synchronous call (it ran on this stream)
    late = torch.full((4096,), float(rank), device=dev)
    wl = dist.all_reduce(late, async_op=True)
    more = torch.full((4096,), 1.0, device=dev)
    dist.all_reduce(more, async_op=True).wait()
    c.eq("late future", wl.get_future().wait()[0].cpu(), torch.full((4096,), float(sum(range(world)))))
    c.true("late future done", wl.get_future().done())
    sync_t = torch.full((16,), float(rank + 1), device=dev)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # what dist.all_reduce(async_op=False) sends; it drops the work
    wsync = dist.distributed_c10d._get_default_group().allreduce([sync_t], opts)
    c.eq("future of a synchronous call", wsync.get_future().then(lambda f: f.value()[0] + 1).wait().cpu(),
         torch.full((16,), float(sum(range(1, world + 1)) + 1)))
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
    # reductions NCCL lacks go through CPU memory
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
    # PREMUL_SUM: the factor as a double and as a CUDA tensor (as FSDP passes it)
    for f in (0.5 * (rank + 1), torch.tensor([0.5 * (rank + 1)], device=dev)):
        p = torch.full((1000,), float(rank + 1), device=dev, dtype=torch.bfloat16)
        dist.all_reduce(p, op=dist._make_nccl_premul_sum(f))
        want = sum(0.5 * (r + 1) * (r + 1) for r in range(world))
        c.eq(f"premul sum ({type(f).__name__} factor)", p.cpu(), torch.full((1000,), want, dtype=torch.bfloat16))
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


def _one_shot_cap(world: int) -> int:
    """The largest all_reduce the one-shot kernel takes (the settings or their auto values)."""
    import rustccl

    return rustccl._rustccl._peer_limits(world)[0]


def _stats_algo() -> str:
    """The path of the last all_reduce whose work the watchdog has reaped
    (it records stats shortly after the device finishes)."""
    import time

    import rustccl

    torch.cuda.synchronize()
    deadline = time.monotonic() + 5
    while "all_reduce" not in rustccl.stats()["ops"] and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the latest one too
    return rustccl.stats()["ops"].get("all_reduce", {}).get("algorithm", "none")


def one_shot(rank: int, world: int) -> tuple[int, list[str]]:
    """The NVLink one-shot all-reduce: chosen where it should be, results vs
    a float64 reference, bitwise identical on every rank, misaligned views,
    many calls in flight mixed with NCCL ones, NaN in MIN / MAX, and
    RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES as the boundary."""
    import os

    dev = _dev(rank)
    c = Checker(rank)
    cap = _one_shot_cap(world)

    nvlink = all(torch.cuda.can_device_access_peer(rank, r) for r in range(world) if r != rank)
    nvlink = nvlink and os.environ.get("RUSTCCL_TEST_EXPECT_NCCL") != "1"
    x = torch.ones(cap // 4, device=dev)
    dist.all_reduce(x)
    c.eq("cap-sized all_reduce", x.cpu(), torch.full((cap // 4,), float(world)))
    c.true(f"cap-sized all_reduce takes the one-shot path (nvlink={nvlink}): {_stats_algo()}",
           _stats_algo() == ("one_shot" if nvlink else "nccl"))
    x = torch.ones(cap // 4 + 1, device=dev)
    dist.all_reduce(x)
    c.eq("cap+4 all_reduce", x.cpu(), torch.full((cap // 4 + 1,), float(world)))
    import rustccl
    above = "two_shot" if nvlink and rustccl._rustccl._peer_limits(world)[1] > cap else "nccl"
    c.true(f"above the cap {above} runs it: {_stats_algo()}", _stats_algo() == above)
    # random values, every float dtype and op, sizes off 16-byte multiples
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-2, torch.bfloat16: 5e-2}
    for dtype in tol:
        for opname in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
            for n in (1, 3, 37, 4097, 70_001):
                if n * dtype.itemsize > cap:
                    continue
                ins = [torch.randn(n, generator=torch.Generator().manual_seed(1000 * r + n), dtype=torch.float64)
                       .to(dtype) for r in range(world)]
                if opname == "PRODUCT":
                    ins = [(t.double().abs() * 0.5 + 0.75).to(dtype) for t in ins]
                x = ins[rank].to(dev)
                dist.all_reduce(x, op=OPS[opname])
                s = torch.stack([t.double() for t in ins])
                want = {"SUM": s.sum(0), "AVG": s.sum(0) / world, "PRODUCT": s.prod(0),
                        "MIN": s.amin(0), "MAX": s.amax(0)}[opname]
                got = x.cpu().double()
                t = tol[dtype]
                c.true(f"{dtype} {opname} n={n}: max err {(got - want).abs().max().item():.3g}",
                       torch.allclose(got, want, rtol=t, atol=t * world))
                everyone = [torch.empty(n * dtype.itemsize, dtype=torch.uint8, device=dev) for _ in range(world)]
                dist.all_gather(everyone, x.view(torch.uint8))
                c.true(f"{dtype} {opname} n={n}: identical on every rank",
                       all(torch.equal(everyone[0], e) for e in everyone))
    # misaligned (4 bytes past a 16-byte boundary) view; neighbours untouched
    base = torch.full((1003,), -7.0, device=dev)
    view = base[1:1002]
    view.copy_(torch.arange(1001, dtype=torch.float32) + rank)
    dist.all_reduce(view)
    want = (torch.arange(1001, dtype=torch.float32) * world + sum(range(world)))
    c.eq("misaligned view", view.cpu(), want)
    c.true("misaligned view's neighbours", base[0].item() == -7.0 and base[1002].item() == -7.0)
    # NaN propagates through the one-shot MIN / MAX (like torch.minimum;
    # NCCL's own MIN / MAX do not promise it)
    for opname in ("MIN", "MAX") if nvlink else ():
        x = torch.arange(10, dtype=torch.float32, device=dev)
        if rank == world - 1:
            x[3] = float("nan")
        dist.all_reduce(x, op=OPS[opname])
        c.true(f"NaN through {opname}", bool(torch.isnan(x[3]).item()) and not bool(torch.isnan(x[4]).item()))
    # many in flight, one-shot and NCCL interleaved on the group's stream
    small = [torch.full((1000 + k,), float(rank + k), device=dev) for k in range(64)]
    large = [torch.full((cap // 4 + 64,), float(rank * k), device=dev) for k in range(4)]
    bump = torch.zeros(1000, device=dev)
    works = []
    for k, t in enumerate(small):
        works.append(dist.all_reduce(t, async_op=True))
        if k % 16 == 0:
            works.append(dist.all_reduce(large[k // 16], async_op=True))
            bump.add_(1)  # a kernel on the caller's stream between the two (not on `t`: it is in flight)
    for w in works:
        w.wait()
    for k, t in enumerate(small):
        c.eq(f"in flight {k}", t.cpu(), torch.full((1000 + k,), float(sum(r + k for r in range(world)))))
    for k, t in enumerate(large):
        c.eq(f"in flight large {k}", t.cpu(), torch.full((cap // 4 + 64,), float(sum(r * k for r in range(world)))))
    # integer wrap-around, as on the CPU path
    x = torch.full((5,), 2**31 - 1, dtype=torch.int32, device=dev)
    dist.all_reduce(x)
    want = torch.tensor([(2**31 - 1) * world], dtype=torch.int64).to(torch.int32).expand(5)
    c.eq("int32 sum wraps", x.cpu(), want.contiguous())
    return c.count, c.failures


def graphs(rank: int, world: int) -> tuple[int, list[str]]:
    """all_reduce captured in a CUDA graph (one-shot and NCCL sizes) replays
    with new inputs; uncapturable calls fail with a clear error."""
    dev = _dev(rank)
    c = Checker(rank)
    cap = _one_shot_cap(world)
    small = torch.zeros(1000, device=dev)
    big = torch.zeros(cap // 4 + 1000, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up: communicators and one-shot buffers exist before capture
            dist.all_reduce(small)
            dist.all_reduce(big)
            dist.all_reduce(small, op=dist.ReduceOp.MAX)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(small)
        small.mul_(2)
        dist.all_reduce(big)
        dist.all_reduce(small, op=dist.ReduceOp.MAX)
    for it in range(5):
        small.copy_(torch.arange(1000, dtype=torch.float32) * (rank + 1) + it)
        big.fill_(float(rank + it))
        g.replay()
        s = sum(torch.arange(1000, dtype=torch.float32) * (r + 1) + it for r in range(world)) * 2
        c.eq(f"replay {it}: one-shot all_reduce + mul + MAX", small.cpu(), s)
        c.eq(f"replay {it}: NCCL all_reduce", big.cpu(), torch.full_like(big, float(sum(r + it for r in range(world)))).cpu())
    # eager calls after the graph still line up with the replays
    x = torch.full((77,), float(rank), device=dev)
    dist.all_reduce(x)
    c.eq("eager after replays", x.cpu(), torch.full((77,), float(sum(range(world)))))
    # a reduction staged through CPU memory cannot be captured: clear error
    b = torch.ones(8, dtype=torch.int32, device=dev)
    g2 = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g2):
            dist.all_reduce(b, op=dist.ReduceOp.BXOR)
        c.true("BXOR under capture raises", False)
    except RuntimeError as e:
        c.true(f"BXOR under capture message: {e}", "rustccl all_reduce" in str(e) and "graph" in str(e))
    torch.cuda.synchronize()
    x = torch.full((5,), float(rank), device=dev)
    dist.all_reduce(x)
    c.eq("group works after the refused capture", x.cpu(), torch.full((5,), float(sum(range(world)))))
    return c.count, c.failures


def stalled_peer(rank: int, world: int) -> tuple[int, list[str]]:
    """Rank 1 stops calling collectives: rank 0's one-shot kernel, waiting
    for it on the GPU, gives up when the group times out (the watchdog
    raises its abort word), the device is free again, and later calls fail
    naming the cause."""
    import time

    dev = _dev(rank)
    c = Checker(rank)
    x = torch.ones(256, device=dev)
    dist.all_reduce(x)  # sets up the one-shot path on every rank
    torch.cuda.synchronize()
    c.true(f"one-shot path in use: {_stats_algo()}", _stats_algo() == "one_shot")
    if rank == 0:
        t0 = time.monotonic()
        dist.all_reduce(x)  # rank 1 never joins
        torch.cuda.synchronize()  # returns once the wait is aborted
        waited = time.monotonic() - t0
        c.true(f"device free again after the group timeout ({waited:.1f} s)", 3.0 < waited < 30.0)
        try:
            dist.all_reduce(x)
            torch.cuda.synchronize()
            c.true("a later call fails", False)
        except Exception as e:  # noqa: BLE001 - DistBackendError or RuntimeError
            c.true(f"the later call names the cause: {e}", "rustccl" in str(e) and " Timed out " in str(e))
    else:
        time.sleep(10)
    return c.count, c.failures
