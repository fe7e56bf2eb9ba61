"""Rank-side bodies of the NVLink peer-memory tests (test_cuda.py): the
two-shot all-reduce, all_gather_into_tensor and reduce_scatter_tensor
through peer memory, graph capture, stalled peers and the NCCL fallback.

Results are compared bit for bit with a reference computed on the host in
the kernels' order (every rank's input combined in rank order 0..world-1,
float16 / bfloat16 accumulated in float32), with a float64 reference within
a tolerance, across ranks, and (all_gather) with NCCL on the same inputs.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from refs import Checker

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64)
OPNAMES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _dev(rank: int) -> torch.device:
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def limits(world: int) -> tuple[int, int, int]:
    """(one-shot all_reduce, any NVLink all_reduce, all_gather / reduce_scatter) bytes."""
    import rustccl

    return rustccl._rustccl._peer_limits(world)


def nvlink(rank: int, world: int) -> bool:
    if os.environ.get("RUSTCCL_TEST_EXPECT_NCCL") == "1":
        return False
    return all(torch.cuda.can_device_access_peer(rank, r) for r in range(world) if r != rank)


def algo(op: str) -> str:
    """The path of the last `op` the watchdog has reaped."""
    import rustccl

    torch.cuda.synchronize()
    deadline = time.monotonic() + 5
    while op not in rustccl.stats()["ops"] and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    return rustccl.stats()["ops"].get(op, {}).get("algorithm", "none")


def inputs(dtype, opname: str, world: int, n: int, seed: int) -> list[torch.Tensor]:
    """Every rank's input (the same on every rank: seeded by rank)."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 100 + r)
        if dtype.is_floating_point:
            t = torch.randn(n, generator=g, dtype=torch.float64)
            if opname == "PRODUCT":
                t = t.abs() * 0.5 + 0.75
        else:
            hi = 5 if opname == "PRODUCT" else 1 << 20
            t = torch.randint(-hi, hi, (n,), generator=g, dtype=torch.int64)
        out.append(t.to(dtype))
    return out


def exact(dtype, opname: str, ins: list[torch.Tensor]) -> torch.Tensor:
    """The kernels' result: rank order, float32 accumulation for 16-bit floats."""
    acc_t = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = ins[0].to(acc_t)
    for t in ins[1:]:
        t = t.to(acc_t)
        acc = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul,
               "MIN": torch.minimum, "MAX": torch.maximum}[opname](acc, t)
    if opname == "AVG":
        acc = acc / len(ins) if acc_t.is_floating_point else torch.div(acc, len(ins), rounding_mode="trunc")
    return acc.to(dtype)


def approx(dtype, opname: str, ins: list[torch.Tensor]) -> torch.Tensor:
    s = torch.stack([t.double() for t in ins])
    return {"SUM": s.sum(0), "AVG": s.sum(0) / len(ins), "PRODUCT": s.prod(0), "MIN": s.amin(0), "MAX": s.amax(0)}[opname]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _identical_everywhere(x: torch.Tensor, world: int, dev) -> bool:
    raw = x.contiguous().view(torch.uint8)
    everyone = [torch.empty_like(raw) for _ in range(world)]
    dist.all_gather(everyone, raw)
    return all(torch.equal(everyone[0], e) for e in everyone)


def _check_reduction(c: Checker, what: str, got: torch.Tensor, dtype, opname: str, ins, bits: bool) -> None:
    """`bits`: rustccl's kernels ran it, so the result must be bitwise the
    rank-order reference (NCCL, e.g. its AVG, which pre-scales each input,
    need not be; integers are exact either way)."""
    if bits or not dtype.is_floating_point:
        want = exact(dtype, opname, ins)
        c.true(f"{what}: bitwise equal to the rank-order reference", _same_bits(got.cpu(), want))
    if dtype.is_floating_point:
        t = TOL[dtype]
        err = (got.cpu().double() - approx(dtype, opname, ins)).abs().max().item() if got.numel() else 0.0
        c.true(f"{what}: close to the float64 reference (max err {err:.3g})",
               torch.allclose(got.cpu().double(), approx(dtype, opname, ins), rtol=t, atol=t * len(ins)))


def two_shot(rank: int, world: int) -> tuple[int, list[str]]:
    """Run with RUSTCCL_ONE_SHOT_MAX_BYTES=16: every all_reduce above 16 B
    up to the NVLink limit takes the two-shot kernel."""
    dev = _dev(rank)
    c = Checker(rank)
    one, ar_max, _ = limits(world)
    peer = nvlink(rank, world)
    x = torch.ones(4, device=dev)
    dist.all_reduce(x)
    c.true(f"16 B: one-shot ({algo('all_reduce')})", algo("all_reduce") == ("one_shot" if peer else "nccl"))
    sizes = [5, 37, 4097, 70_001, 1_000_003]
    for dtype in FLOATS + INTS:
        for opname in OPNAMES:
            for n in sizes:
                if n * dtype.itemsize > ar_max or (n > 70_001 and opname not in ("SUM", "MAX")):
                    continue
                ins = inputs(dtype, opname, world, n, seed=n)
                x = ins[rank].to(dev)
                dist.all_reduce(x, op=getattr(dist.ReduceOp, opname))
                what = f"two-shot {dtype} {opname} n={n}"
                if n == 4097 and dtype == torch.float32 and opname == "SUM":
                    c.true(f"{what} path: {algo('all_reduce')}", algo("all_reduce") == ("two_shot" if peer else "nccl"))
                _check_reduction(c, what, x, dtype, opname, ins, bits=peer)
                c.true(f"{what}: identical on every rank", _identical_everywhere(x, world, dev))
    # a misaligned view (4 bytes past a 16-byte boundary); neighbours untouched
    base = torch.full((100_003,), -7.0, device=dev)
    view = base[1:100_002]
    view.copy_(torch.arange(100_001, dtype=torch.float32) + rank)
    dist.all_reduce(view)
    c.eq("two-shot misaligned view", view.cpu(), torch.arange(100_001, dtype=torch.float32) * world + sum(range(world)))
    c.true("two-shot misaligned view's neighbours", base[0].item() == -7.0 and base[100_002].item() == -7.0)
    # NaN propagates through MIN / MAX in rustccl's kernels (NCCL's MAX
    # drops it, so only where the kernels run)
    x = torch.arange(1000, dtype=torch.float32, device=dev)
    if rank == world - 1:
        x[3] = float("nan")
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    if peer:
        c.true("two-shot NaN through MAX", bool(torch.isnan(x[3]).item()) and not bool(torch.isnan(x[4]).item()))
    # the limit: at it two-shot, above it NCCL
    n = ar_max // 4
    for m, path in ((n, "two_shot"), (n + 1, "nccl")):
        x = torch.full((m,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        c.eq(f"all_reduce of {m * 4} B", x.cpu(), torch.full((m,), float(sum(range(1, world + 1)))))
        c.true(f"{m * 4} B path: {algo('all_reduce')}", algo("all_reduce") == (path if peer else "nccl"))
    in_flight(c, rank, world, dev)
    return c.count, c.failures


def in_flight(c: Checker, rank: int, world: int, dev) -> None:
    """Many async calls of every path (one-shot, two-shot, NCCL, all-gather,
    reduce-scatter) on the group's stream, then their results."""
    one, ar_max, ga = limits(world)
    sizes = [3, max(one // 4 + 5, 5), 70_001, ar_max // 4 + 7]
    ars = [torch.full((sizes[k % 4],), float(rank + k), device=dev) for k in range(24)]
    n = max(ga // 4 // world - 3, 1)
    ag_in = [torch.full((n,), float(rank * 100 + k), device=dev) for k in range(8)]
    ag_out = [torch.empty(world * n, device=dev) for _ in range(8)]
    rs_in = [torch.arange(world * n, dtype=torch.float32, device=dev) * (rank + k) for k in range(8)]
    rs_out = [torch.empty(n, device=dev) for _ in range(8)]
    bump = torch.zeros(1000, device=dev)
    works = []
    for k, t in enumerate(ars):
        works.append(dist.all_reduce(t, async_op=True))
        if k % 3 == 0:
            j = k // 3
            works.append(dist.all_gather_into_tensor(ag_out[j], ag_in[j], async_op=True))
            works.append(dist.reduce_scatter_tensor(rs_out[j], rs_in[j], async_op=True))
            bump.add_(1)  # a kernel on the caller's stream between them (not on `t`: it is in flight)
    for w in works:
        w.wait()
    for k, t in enumerate(ars):
        c.eq(f"in flight all_reduce {k}", t.cpu(), torch.full((sizes[k % 4],), float(sum(r + k for r in range(world)))))
    for j in range(8):
        c.eq(f"in flight all_gather {j}", ag_out[j].cpu(),
             torch.cat([torch.full((n,), float(r * 100 + j)) for r in range(world)]))
        base = torch.arange(world * n, dtype=torch.float32)[rank * n:(rank + 1) * n]
        c.eq(f"in flight reduce_scatter {j}", rs_out[j].cpu(), sum(base * (r + j) for r in range(world)))
    mixed_streams(c, rank, world, dev)


def mixed_streams(c: Checker, rank: int, world: int, dev) -> None:
    """Synchronous calls (which run on the caller's stream) and async ones
    (rustccl's stream) from three streams, interleaved: the group's launches
    stay in one order, so every result is right."""
    one, ar_max, ga = limits(world)
    streams = [torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.current_stream()]
    sizes = [1000, max(one // 4 + 3, 7), 4099]
    xs = [torch.full((sizes[k % 3],), float(rank + k), device=dev) for k in range(36)]
    n = max(ga // 4 // world // 2, 1)
    ag = [(torch.full((n,), float(rank + k), device=dev), torch.empty(world * n, device=dev)) for k in range(36)]
    torch.cuda.synchronize()
    works = []
    for k, x in enumerate(xs):
        with torch.cuda.stream(streams[k % 3]):
            if k % 2 == 0:
                dist.all_reduce(x)
                dist.all_gather_into_tensor(ag[k][1], ag[k][0], async_op=True).wait()
            else:
                works.append(dist.all_reduce(x, async_op=True))
                dist.all_gather_into_tensor(ag[k][1], ag[k][0])
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    for k, x in enumerate(xs):
        c.eq(f"mixed streams all_reduce {k}", x.cpu(), torch.full((sizes[k % 3],), float(sum(r + k for r in range(world)))))
        c.eq(f"mixed streams all_gather {k}", ag[k][1].cpu(), torch.cat([torch.full((n,), float(r + k)) for r in range(world)]))


def gather_scatter(rank: int, world: int) -> tuple[int, list[str]]:
    """all_gather_into_tensor bitwise equal to NCCL's, reduce_scatter_tensor
    equal to the rank-order reference, odd sizes, in-place, misaligned views,
    the size limit, and both mixed with all_reduces in flight."""
    dev = _dev(rank)
    c = Checker(rank)
    nccl = dist.new_group(backend="nccl")
    _, _, ga = limits(world)
    peer = nvlink(rank, world)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.bool, torch.int64):
        for n in (1, 3, 7, 1000, 4099, ga // world // dtype.itemsize):
            g = torch.Generator().manual_seed(n * 7 + rank)
            mine = torch.randint(0, 100, (n,), generator=g).to(dtype).to(dev)
            out = torch.empty(world * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, mine)
            ref = torch.empty_like(out)
            dist.all_gather_into_tensor(ref, mine, group=nccl)
            what = f"all_gather_into_tensor {dtype} n={n}"
            c.true(f"{what}: bitwise equal to NCCL's", _same_bits(out, ref))
            if n == 1000 and dtype == torch.float32:
                c.true(f"{what} path: {algo('all_gather')}", algo("all_gather") == ("peer_copy" if peer else "nccl"))
    # in place: the input is this rank's chunk of the output
    out = torch.zeros(world * 1001, device=dev)
    out[rank * 1001:(rank + 1) * 1001] = torch.arange(1001, dtype=torch.float32) + rank
    dist.all_gather_into_tensor(out, out[rank * 1001:(rank + 1) * 1001])
    c.eq("all_gather_into_tensor in place", out.cpu(), torch.cat([torch.arange(1001, dtype=torch.float32) + r for r in range(world)]))
    # misaligned input and output
    base_in = torch.zeros(1002, device=dev)
    base_out = torch.full((world * 1001 + 2,), -7.0, device=dev)
    base_in[1:].copy_(torch.arange(1001, dtype=torch.float32) * (rank + 1))
    dist.all_gather_into_tensor(base_out[1:world * 1001 + 1], base_in[1:])
    c.eq("all_gather misaligned", base_out[1:world * 1001 + 1].cpu(),
         torch.cat([torch.arange(1001, dtype=torch.float32) * (r + 1) for r in range(world)]))
    c.true("all_gather misaligned neighbours", base_out[0].item() == -7.0 and base_out[-1].item() == -7.0)
    # above the limit: NCCL
    n = ga // world // 4 + 1
    out = torch.empty(world * n, device=dev)
    dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=dev))
    c.eq("all_gather above the limit", out.cpu(), torch.cat([torch.full((n,), float(r)) for r in range(world)]))
    c.true(f"all_gather above the limit path: {algo('all_gather')}", algo("all_gather") == "nccl")
    # reduce_scatter_tensor: every dtype and op it claims
    for dtype in FLOATS + INTS:
        for opname in OPNAMES:
            for n in (1, 5, 37, 4097, ga // world // dtype.itemsize):
                parts = inputs(dtype, opname, world * world, n, seed=n + 1)  # part (s, d) = parts[s * world + d]
                mine = torch.cat([parts[rank * world + d] for d in range(world)]).to(dev)
                out = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(out, mine, op=getattr(dist.ReduceOp, opname))
                what = f"reduce_scatter_tensor {dtype} {opname} n={n}"
                _check_reduction(c, what, out, dtype, opname, [parts[s * world + rank] for s in range(world)], bits=peer)
                if n == 37 and dtype == torch.float32 and opname == "SUM":
                    c.true(f"{what} path: {algo('reduce_scatter')}", algo("reduce_scatter") == ("peer_copy" if peer else "nccl"))
    # misaligned reduce_scatter input (scalar path)
    base = torch.zeros(world * 999 + 1, device=dev)
    base[1:].copy_(torch.arange(world * 999, dtype=torch.float32) + rank)
    out = torch.empty(999, device=dev)
    dist.reduce_scatter_tensor(out, base[1:])
    want = sum(torch.arange(world * 999, dtype=torch.float32)[rank * 999:(rank + 1) * 999] + r for r in range(world))
    c.eq("reduce_scatter misaligned", out.cpu(), want)
    in_flight(c, rank, world, dev)
    dist.barrier()
    return c.count, c.failures


def graphs(rank: int, world: int) -> tuple[int, list[str]]:
    """Two-shot all_reduce, all_gather_into_tensor and reduce_scatter_tensor
    captured in one CUDA graph with a one-shot and an NCCL all_reduce;
    replays with new inputs give the right results."""
    dev = _dev(rank)
    c = Checker(rank)
    one, ar_max, ga = limits(world)
    small = torch.zeros(1000, device=dev)
    mid = torch.zeros(min(one // 4 + 1000, ar_max // 4), device=dev)
    big = torch.zeros(ar_max // 4 + 1000, device=dev)
    n = ga // world // 4
    ag_in, ag_out = torch.zeros(n, device=dev), torch.zeros(world * n, device=dev)
    rs_in, rs_out = torch.zeros(world * n, device=dev), torch.zeros(n, device=dev)

    def calls():
        dist.all_reduce(small)
        dist.all_reduce(mid)
        dist.all_gather_into_tensor(ag_out, ag_in)
        dist.all_reduce(big)
        dist.reduce_scatter_tensor(rs_out, rs_in)
        mid.mul_(2)
        dist.all_reduce(mid, op=dist.ReduceOp.MAX)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up: communicators and NVLink buffers exist before capture
            calls()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        calls()
    for it in range(4):
        small.fill_(float(rank + it))
        mid.copy_(torch.arange(mid.numel(), dtype=torch.float32) * (rank + 1) + it)
        big.fill_(float(rank * it))
        ag_in.fill_(float(rank * 10 + it))
        rs_in.copy_(torch.arange(world * n, dtype=torch.float32) + rank + it)
        g.replay()
        ar = torch.arange(mid.numel(), dtype=torch.float32)
        c.eq(f"replay {it}: one-shot", small.cpu(), torch.full((1000,), float(sum(r + it for r in range(world)))))
        c.eq(f"replay {it}: two-shot + mul + MAX", mid.cpu(), sum(ar * (r + 1) + it for r in range(world)) * 2)
        c.eq(f"replay {it}: NCCL", big.cpu(), torch.full((big.numel(),), float(sum(r * it for r in range(world)))))
        c.eq(f"replay {it}: all_gather", ag_out.cpu(), torch.cat([torch.full((n,), float(r * 10 + it)) for r in range(world)]))
        base = torch.arange(world * n, dtype=torch.float32)[rank * n:(rank + 1) * n]
        c.eq(f"replay {it}: reduce_scatter", rs_out.cpu(), sum(base + r + it for r in range(world)))
    x = torch.full((77,), float(rank), device=dev)
    dist.all_reduce(x)
    c.eq("eager after replays", x.cpu(), torch.full((77,), float(sum(range(world)))))
    return c.count, c.failures


def stalled_peer(rank: int, world: int, op: str) -> tuple[int, list[str]]:
    """Rank 1 stops calling collectives: rank 0's kernel (two-shot all_reduce,
    all_gather or reduce_scatter), waiting on the GPU, gives up at the group
    timeout, the device is free again, and later calls fail naming the cause."""
    dev = _dev(rank)
    c = Checker(rank)
    one, ar_max, ga = limits(world)
    n = ga // world // 4

    def call():
        if op == "two_shot":
            dist.all_reduce(torch.ones(min(one // 4 + 1000, ar_max // 4), device=dev))
        elif op == "all_gather":
            dist.all_gather_into_tensor(torch.empty(world * n, device=dev), torch.ones(n, device=dev))
        else:
            dist.reduce_scatter_tensor(torch.empty(n, device=dev), torch.ones(world * n, device=dev))

    call()  # sets up the NVLink path on every rank
    stat = {"two_shot": ("all_reduce", "two_shot"), "all_gather": ("all_gather", "peer_copy"),
            "reduce_scatter": ("reduce_scatter", "peer_copy")}[op]
    c.true(f"{op} path in use: {algo(stat[0])}", algo(stat[0]) == stat[1])
    if rank == 0:
        t0 = time.monotonic()
        call()  # rank 1 never joins
        torch.cuda.synchronize()
        waited = time.monotonic() - t0
        c.true(f"{op}: device free again after the group timeout ({waited:.1f} s)", 3.0 < waited < 30.0)
        try:
            call()
            torch.cuda.synchronize()
            c.true(f"{op}: a later call fails", False)
        except Exception as e:  # noqa: BLE001 - DistBackendError or RuntimeError
            c.true(f"{op}: the later call names the cause: {e}", "rustccl" in str(e) and " Timed out " in str(e))
    else:
        time.sleep(10)
    return c.count, c.failures


def no_peers(rank: int, world: int) -> tuple[int, list[str]]:
    """Launched with init="none": each rank sees only its own GPU
    (CUDA_VISIBLE_DEVICES), so the NVLink setup fails on every rank and
    every call goes to NCCL, with the right results."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("rustccl", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}")
    c = Checker(rank)
    c.true("one GPU visible", torch.cuda.device_count() == 1)
    for n in (1000, 300_001):
        x = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        c.eq(f"all_reduce n={n}", x.cpu(), torch.full((n,), float(sum(range(1, world + 1)))))
        c.true(f"all_reduce n={n} via NCCL: {algo('all_reduce')}", algo("all_reduce") == "nccl")
    out = torch.empty(world * 100, device=dev)
    dist.all_gather_into_tensor(out, torch.full((100,), float(rank), device=dev))
    c.eq("all_gather", out.cpu(), torch.cat([torch.full((100,), float(r)) for r in range(world)]))
    c.true(f"all_gather via NCCL: {algo('all_gather')}", algo("all_gather") == "nccl")
    out = torch.empty(100, device=dev)
    dist.reduce_scatter_tensor(out, torch.ones(world * 100, device=dev))
    c.eq("reduce_scatter", out.cpu(), torch.full((100,), float(world)))
    c.true(f"reduce_scatter via NCCL: {algo('reduce_scatter')}", algo("reduce_scatter") == "nccl")
    dist.destroy_process_group()
    return c.count, c.failures
