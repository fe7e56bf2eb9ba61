"""Rank-side bodies of the collective tests: every collective torch routes to
a backend, on CPU tensors, against references computed locally."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import rustccl

from refs import DTYPES, OPS, Checker, reference, supported, values

# 0 and 1 elements, a size not divisible by any world size > 1, one above the
# recursive-doubling threshold (ring path), one spanning many segments.
SIZES = [0, 1, 7, 1000, 20_011]


def all_reduce_matrix(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    for dtype in DTYPES:
        for opname, op in OPS.items():
            if not supported(dtype, opname):
                continue
            for n in SIZES:
                x = values(dtype, opname, rank, n)
                dist.all_reduce(x, op=op)
                want = reference(dtype, opname, [values(dtype, opname, r, n) for r in range(world)])
                c.eq(f"all_reduce {dtype} {opname} n={n}", x, want, opname)
    th = rustccl.stats()["thresholds"]
    if "shm_threads" in th:
        # a waiting thread polls up to 500 us where every local rank has one
        # thread and a core, else 60 us, or as set
        cores = len(os.sched_getaffinity(0))
        adapts = th["shm_threads"] == 1 and th["local_ranks"] <= cores
        want = int(os.environ.get("RUSTCCL_SHM_WAIT_SPIN_US", 500 if adapts else 60))
        c.true(f"waits poll as the host allows or as set: {th}", th["shm_wait_spin_max_us"] == want)
        # a gather root reads a quarter of each pushed block between 2 ranks
        # of one thread, else none, or as set
        share = int(os.environ.get("RUSTCCL_SHM_GATHER_ROOT_SHARE", "0")) or (4 if th["local_ranks"] == 2 and th["shm_threads"] == 1 else 1)
        c.true(f"a gather root's share as the host allows or as set: {th}", th["shm_gather_root_share"] == min(share, 31))
    if "shm_threads" in th and "RUSTCCL_SHM_STAGED_SEND_MAX_BYTES" not in os.environ:
        # no staging area for ranks of at most 2 threads, else 2 MiB a
        # thread, at most 8 MiB (none where nothing is read)
        t = th["shm_threads"]
        area = 0 if t <= 2 or os.environ.get("RUSTCCL_SHM_ATTACH_MIN_BYTES") == "off" else min(2 * t << 20, 8 << 20)
        c.true(f"the staging area as the host allows: {th}", th["shm_staged_send_max_bytes"] == area)
    if "shm_threads" in th and "RUSTCCL_SHM_SPIN_US" not in os.environ:
        # left to the host: the team spins 200 us only where the local
        # ranks' threads take at most a quarter of the cores; pieces of
        # 256 KiB (at most a slot, RUSTCCL_SHM_SEGMENT_BYTES)
        roomy = th["shm_threads"] > 1 and th["local_ranks"] * th["shm_threads"] * 4 <= len(os.sched_getaffinity(0))
        c.true(f"idle threads spin as the host allows: {th}", th["shm_spin_us"] == (200 if roomy else 0))
        if "RUSTCCL_SHM_QUICK_THREADS" not in os.environ:
            # a quick team of a rank's share of a quarter of the cores
            # where the workers sleep, none below 2
            # (a share of one: 2 where the team leads, by default with up
            # to 4 local ranks, or with 16 or more)
            share = min(len(os.sched_getaffinity(0)) // 4 // th["local_ranks"], th["shm_threads"])
            leads = os.environ.get("RUSTCCL_SHM_QUICK_LEADS", str(int(th["local_ranks"] <= 4))) == "1"
            if share == 1 and th["shm_threads"] >= 2 and (leads or th["local_ranks"] >= 16):
                share = 2
            quick = 0 if roomy or share < 2 else share
            c.true(f"a quick team as the host allows: {th}", th["shm_quick_threads"] == quick)
            c.true(f"a quick team leads larger phases with up to 4 local ranks: {th}",
                   th["shm_quick_leads"] == int(quick > 0 and th["local_ranks"] <= 4))
        if not {"RUSTCCL_SHM_SEGMENT_BYTES", "RUSTCCL_SHM_SLOT_MIN_BYTES"} & set(os.environ):
            # slots of 256 KiB a thread, at least 2 MiB with 2 local ranks,
            # or 3-4 of 4 threads or more
            few = th["local_ranks"] == 2 or (3 <= th["local_ranks"] <= 4 and th["shm_threads"] >= 4)
            slot = max((256 << 10) * th["shm_threads"], (2 << 20) if few else 0)
            c.true(f"slots as the host allows: {th}", th["shm_slot_bytes"] == slot)
        if "RUSTCCL_SHM_MIN_PIECE_BYTES" not in os.environ:
            # a thread's piece of a slot (RUSTCCL_SHM_SEGMENT_BYTES), at most 256 KiB
            piece = min(256 << 10, int(os.environ.get("RUSTCCL_SHM_SEGMENT_BYTES", 256 << 10)))
            c.true(f"pieces of 256 KiB or a slot: {th}", th["shm_min_piece_bytes"] == piece)
    elif "shm_threads" in th:
        c.true(f"spin setting in force: {th}", th["shm_spin_us"] == int(os.environ["RUSTCCL_SHM_SPIN_US"]))
        quick = int(os.environ.get("RUSTCCL_SHM_QUICK_THREADS", "0"))
        c.true(f"no quick team beside a set spin unless set: {th}", th["shm_quick_threads"] == (quick if quick >= 2 else 0))
        if quick >= 2:
            piece = int(os.environ.get("RUSTCCL_SHM_QUICK_MIN_PIECE_BYTES", "0")) or min(32 << 10, th["shm_min_piece_bytes"])
            c.true(f"the quick team's pieces and phases: {th}",
                   (th["shm_quick_min_piece_bytes"], th["shm_quick_max_bytes"]) == (piece, quick * (256 << 10)))
            # the team leads larger phases with up to 4 local ranks; then
            # all_to_all's copies keep its usual limit, else 1 MiB a thread
            leads = int(os.environ.get("RUSTCCL_SHM_QUICK_LEADS", str(int(th["local_ranks"] <= 4))))
            c.true(f"the quick team leads as set or as the host allows: {th}", th["shm_quick_leads"] == leads)
            a2a = int(os.environ.get("RUSTCCL_SHM_QUICK_ALL_TO_ALL_BYTES_PER_THREAD", "0")) or (256 << 10 if leads else 1 << 20)
            c.true(f"all_to_all's quick phases: {th}", th["shm_quick_all_to_all_max_bytes"] == quick * a2a)
    return c.count, c.failures


def _ref_sum(dtype, n, world, salt=0):
    return reference(dtype, "SUM", [values(dtype, "SUM", r, n, salt) for r in range(world)])


def async_and_layouts(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    f32 = torch.float32
    # async + wait / is_completed / future
    xs = [values(f32, "SUM", rank, 100, salt=k) for k in range(12)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    futs = [w.get_future() for w in works]
    for k, (w, f) in enumerate(zip(works, futs)):
        w.wait()
        c.true(f"work {k} completed after wait", w.is_completed())
        c.true(f"work {k} success", w.is_success())
        c.eq(f"async all_reduce {k}", xs[k], _ref_sum(f32, 100, world, salt=k))
        v = f.wait()
        c.true(f"future {k} yields the output tensor", isinstance(v, list) and v[0] is not None and torch.equal(v[0], xs[k]))
    # many in flight complete in order: a later work done implies earlier ones done
    xs = [torch.full((50,), float(rank + k)) for k in range(20)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    works[-1].wait()
    c.true("earlier works complete before the last", all(w.is_completed() for w in works))
    for k, x in enumerate(xs):
        c.eq(f"in-flight {k}", x, torch.full((50,), float(sum(r + k for r in range(world)))))
    # future chaining as DDP comm hooks do
    x = values(f32, "SUM", rank, 64)
    fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] / world)
    c.eq("future.then", fut.wait(), _ref_sum(f32, 64, world) / world)
    # non-contiguous in-place buffer: the result lands in the caller's tensor
    base = torch.zeros(40, 3)
    view = base[:, 1]
    view.copy_(values(f32, "SUM", rank, 40))
    dist.all_reduce(view)
    c.eq("non-contiguous all_reduce", view, _ref_sum(f32, 40, world))
    c.true("non-contiguous all_reduce leaves other columns", bool((base[:, 0] == 0).all()) and bool((base[:, 2] == 0).all()))
    t2 = values(f32, "SUM", rank, 12).reshape(3, 4).t()  # transposed
    dist.all_reduce(t2)
    c.eq("transposed all_reduce", t2, _ref_sum(f32, 12, world).reshape(3, 4).t())
    # non-contiguous all_gather outputs
    out = torch.zeros(world, 8, 2)
    outs = [out[r, :, 0] for r in range(world)]
    dist.all_gather(outs, values(f32, "SUM", rank, 8))
    for r in range(world):
        c.eq(f"non-contiguous all_gather out {r}", out[r, :, 0], values(f32, "SUM", r, 8))
    # complex tensors: torch views them as real pairs
    z = torch.complex(values(f32, "SUM", rank, 10), values(f32, "SUM", rank, 10, salt=3))
    dist.all_reduce(z)
    want = torch.complex(_ref_sum(f32, 10, world), _ref_sum(f32, 10, world, salt=3))
    c.eq("complex64 all_reduce", z, want)
    # barrier
    dist.barrier()
    return c.count, c.failures


def rooted_and_gathers(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    cap = os.environ.get("RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES")
    got = rustccl.stats()["thresholds"].get("shm_scatter_split_max_bytes")
    if cap is not None and got is not None:
        # a scatter root splits the blocks up to this size (the case's
        # 24-byte blocks) and lets its receivers read larger ones whole
        c.true(f"scatter split threshold {got} == {cap}", got == int(cap))
    for root in range(world):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
            for n in (0, 1, 7, 5000):
                x = values(dtype, "SUM", rank, n)
                dist.broadcast(x, src=root)
                c.eq(f"broadcast {dtype} root={root} n={n}", x, values(dtype, "SUM", root, n))
                for opname in ("SUM", "MAX", "AVG"):
                    if not supported(dtype, opname):
                        continue
                    x = values(dtype, opname, rank, n)
                    mine = x.clone()
                    dist.reduce(x, dst=root, op=OPS[opname])
                    if rank == root:
                        want = reference(dtype, opname, [values(dtype, opname, r, n) for r in range(world)])
                        c.eq(f"reduce {dtype} {opname} root={root} n={n}", x, want, opname)
                    else:
                        c.eq(f"reduce leaves non-root buffers (root={root})", x, mine)
        # gather / scatter
        for n in (0, 3, 1001):
            x = values(torch.int32, "SUM", rank, n)
            gl = [torch.zeros(n, dtype=torch.int32) for _ in range(world)] if rank == root else None
            dist.gather(x, gather_list=gl, dst=root)
            if rank == root:
                for r in range(world):
                    c.eq(f"gather root={root} from {r} n={n}", gl[r], values(torch.int32, "SUM", r, n))
            out = torch.zeros(n, dtype=torch.float64)
            sl = [values(torch.float64, "SUM", r, n, salt=9) for r in range(world)] if rank == root else None
            dist.scatter(out, scatter_list=sl, src=root)
            c.eq(f"scatter root={root} n={n}", out, values(torch.float64, "SUM", rank, n, salt=9))
            # the root's tensor is also another rank's part: scatter's
            # output is the next rank's input block, gather's input the
            # next rank's output (that rank's data must not be lost, nor
            # the root's own part overwritten by it)
            nxt = (root + 1) % world
            sl = [values(torch.float64, "SUM", r, n, salt=5) for r in range(world)] if rank == root else None
            out = sl[nxt] if rank == root else torch.zeros(n, dtype=torch.float64)
            dist.scatter(out, scatter_list=sl, src=root)
            c.eq(f"scatter into the next rank's block root={root} n={n}", out, values(torch.float64, "SUM", rank, n, salt=5))
            gl = [torch.zeros(n, dtype=torch.int32) for _ in range(world)] if rank == root else None
            x = values(torch.int32, "SUM", rank, n, salt=3)
            if rank == root:
                gl[nxt].copy_(x)
                x = gl[nxt]
            dist.gather(x, gather_list=gl, dst=root)
            if rank == root:
                for r in range(world):
                    c.eq(f"gather from the next rank's part root={root} from {r} n={n}", gl[r], values(torch.int32, "SUM", r, n, salt=3))
    if os.environ.get("RUSTCCL_SHM_ATTACH_MIN_BYTES") == "0":
        # the ranks (separate processes) agreed on reading each other's memory
        st = rustccl.stats()
        c.true(f"single-copy threshold in force: {st['thresholds']}", st["thresholds"].get("shm_attach_min_bytes") == 0)
        c.true(f"root threads in force: {st['thresholds']}", st["thresholds"].get("shm_root_threads") == 3)
        c.true(f"broadcast reads in force: {st['thresholds']}", st["thresholds"].get("shm_broadcast_attach_min_bytes") == 0)
        for op in ("broadcast", "reduce", "gather", "scatter"):
            c.true(f"{op} read the peers directly: {st['ops'][op]['algorithm']}", st["ops"][op]["algorithm"] == "shm_attach")
    # all_gather (list and into_tensor), sizes not divisible by the world
    for dtype in (torch.float16, torch.int8, torch.bool, torch.float64):
        for n in (0, 1, 7, 3000):
            mine = values(dtype, "SUM", rank, n)
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, mine)
            for r in range(world):
                c.eq(f"all_gather {dtype} n={n} part {r}", outs[r], values(dtype, "SUM", r, n))
            out = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(out, mine)
            c.eq(f"all_gather_into_tensor {dtype} n={n}", out, torch.cat([values(dtype, "SUM", r, n) for r in range(world)]))
    # all_gather_into_tensor in place (input is this rank's slice of the output)
    out = torch.zeros(world * 5)
    out[rank * 5:(rank + 1) * 5] = values(torch.float32, "SUM", rank, 5)
    dist.all_gather_into_tensor(out, out[rank * 5:(rank + 1) * 5])
    c.eq("in-place all_gather_into_tensor", out, torch.cat([values(torch.float32, "SUM", r, 5) for r in range(world)]))
    # reduce_scatter (list and tensor)
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for opname in ("SUM", "AVG", "MAX", "PRODUCT"):
            for n in (0, 1, 9, 2001):
                part = lambda src, dst: values(dtype, opname, src * world + dst, n)  # noqa: E731
                want = reference(dtype, opname, [part(src, rank) for src in range(world)])
                ins = [part(rank, dst) for dst in range(world)]
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out, ins, op=OPS[opname])
                c.eq(f"reduce_scatter {dtype} {opname} n={n}", out, want, opname)
                for dst in range(world):
                    c.eq("reduce_scatter leaves inputs", ins[dst], part(rank, dst))
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, torch.cat(ins), op=OPS[opname])
                c.eq(f"reduce_scatter_tensor {dtype} {opname} n={n}", out, want, opname)
    # all_to_all: list, single even, single uneven (some splits empty), 2-D rows
    blk = lambda s, d, rows, cols=1: (torch.arange(rows * cols, dtype=torch.float32) + 1000 * s + 100 * d).reshape(rows, cols)  # noqa: E731
    rows = lambda s, d: (s + 1) * (d + 1) % 4  # noqa: E731
    ins = [blk(rank, d, rows(rank, d), 3) for d in range(world)]
    outs = [torch.empty(rows(s, rank), 3) for s in range(world)]
    dist.all_to_all(outs, ins)
    for s in range(world):
        c.eq(f"all_to_all list from {s}", outs[s], blk(s, rank, rows(s, rank), 3))
    inp = torch.cat(ins)
    out = torch.empty(sum(rows(s, rank) for s in range(world)), 3)
    dist.all_to_all_single(out, inp, output_split_sizes=[rows(s, rank) for s in range(world)],
                           input_split_sizes=[rows(rank, d) for d in range(world)])
    c.eq("all_to_all_single uneven", out, torch.cat([blk(s, rank, rows(s, rank), 3) for s in range(world)]))
    inp = torch.cat([blk(rank, d, 2) for d in range(world)]).flatten()
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    c.eq("all_to_all_single even", out, torch.cat([blk(s, rank, 2) for s in range(world)]).flatten())
    return c.count, c.failures


def coalesced_and_async_variants(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    f32 = torch.float32
    # all_reduce_coalesced (torch requires one dtype; the engine packs them)
    ts = [values(f32, "SUM", rank, n, salt=n) for n in (3, 0, 1000)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (3, 0, 1000)):
        c.eq(f"all_reduce_coalesced n={n}", t, _ref_sum(f32, n, world, salt=n))
    ts = [values(torch.int8, "MAX", rank, 5), values(torch.int8, "MAX", rank, 6, salt=1)]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
    c.eq("all_reduce_coalesced int8 MAX", ts[0], reference(torch.int8, "MAX", [values(torch.int8, "MAX", r, 5) for r in range(world)]))
    # _coalescing_manager: all_reduce, all_gather_into_tensor, reduce_scatter_tensor
    from torch.distributed.distributed_c10d import _coalescing_manager

    xs = [values(f32, "SUM", rank, n, salt=1) for n in (4, 9)]
    with _coalescing_manager(async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    for x, n in zip(xs, (4, 9)):
        c.eq(f"coalescing manager all_reduce n={n}", x, _ref_sum(f32, n, world, salt=1))
    outs = [torch.empty(world * n) for n in (2, 5)]
    with _coalescing_manager():
        for o, n in zip(outs, (2, 5)):
            dist.all_gather_into_tensor(o, values(f32, "SUM", rank, n))
    for o, n in zip(outs, (2, 5)):
        c.eq(f"coalescing manager all_gather n={n}", o, torch.cat([values(f32, "SUM", r, n) for r in range(world)]))
    outs = [torch.empty(n) for n in (2, 5)]
    with _coalescing_manager():
        for o, n in zip(outs, (2, 5)):
            dist.reduce_scatter_tensor(o, torch.cat([values(f32, "SUM", rank * world + d, n) for d in range(world)]))
    for o, n in zip(outs, (2, 5)):
        want = reference(f32, "SUM", [values(f32, "SUM", s * world + rank, n) for s in range(world)])
        c.eq(f"coalescing manager reduce_scatter n={n}", o, want)
    # all_gather_coalesced (deprecated API): outputs[r][i] is input i of rank r
    ins = [values(f32, "SUM", rank, 3), values(f32, "SUM", rank, 4, salt=2)]
    outs = [[torch.empty(3), torch.empty(4)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(world):
        c.eq(f"all_gather_coalesced rank {r} t0", outs[r][0], values(f32, "SUM", r, 3))
        c.eq(f"all_gather_coalesced rank {r} t1", outs[r][1], values(f32, "SUM", r, 4, salt=2))
    # async variants of everything else, waited in reverse order
    x = values(f32, "SUM", rank, 10)
    b = values(f32, "SUM", rank, 10, salt=4)
    outs = [torch.empty(10) for _ in range(world)]
    rs_out = torch.empty(10)
    a2a_out = torch.empty(world * 2)
    works = [
        dist.all_reduce(x, async_op=True),
        dist.broadcast(b, src=world - 1, async_op=True),
        dist.all_gather(outs, values(f32, "SUM", rank, 10), async_op=True),
        dist.reduce_scatter(rs_out, [values(f32, "SUM", rank * world + d, 10) for d in range(world)], async_op=True),
        dist.all_to_all_single(a2a_out, torch.arange(world * 2, dtype=f32) + 100 * rank, async_op=True),
        dist.barrier(async_op=True),
    ]
    for w in reversed(works):
        w.wait()
    c.eq("async all_reduce", x, _ref_sum(f32, 10, world))
    c.eq("async broadcast", b, values(f32, "SUM", world - 1, 10, salt=4))
    for r in range(world):
        c.eq(f"async all_gather {r}", outs[r], values(f32, "SUM", r, 10))
    c.eq("async reduce_scatter", rs_out, reference(f32, "SUM", [values(f32, "SUM", s * world + rank, 10) for s in range(world)]))
    c.eq("async all_to_all_single", a2a_out, torch.cat([torch.arange(2, dtype=f32) + 2 * rank + 100 * s for s in range(world)]))
    return c.count, c.failures


def premul_sum(rank: int, world: int) -> tuple[int, list[str]]:
    """PREMUL_SUM (dist._make_nccl_premul_sum): every rank scales its input
    by its own factor, then the inputs are summed. Factors are binary
    fractions and inputs small integers, so every result is exact."""
    c = Checker(rank)

    def factor(r):
        return 0.5 * (r + 1)

    def want(dtype, inputs):
        return torch.stack([t.double() * factor(r) for r, t in enumerate(inputs)]).sum(0).to(dtype)

    floats = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    for dtype in floats:
        for n in (0, 7, 20_011):
            inputs = [values(dtype, "SUM", r, n) for r in range(world)]
            x = inputs[rank].clone()
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor(rank)))
            c.eq(f"all_reduce premul {dtype} n={n}", x, want(dtype, inputs))
            # the factor as a one-element tensor (as FSDP passes it)
            x = inputs[rank].clone()
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(torch.tensor([factor(rank)], dtype=torch.float64)))
            c.eq(f"all_reduce premul tensor factor {dtype} n={n}", x, want(dtype, inputs))
    f32 = torch.float32
    inputs = [values(f32, "SUM", r, 2 * 501) for r in range(world)]
    # async, and a strided view: the result lands in the caller's elements only
    big = inputs[rank].clone()
    work = dist.all_reduce(big[::2], op=dist._make_nccl_premul_sum(factor(rank)), async_op=True)
    work.wait()
    c.eq("async strided all_reduce premul", big[::2], want(f32, [t[::2] for t in inputs]))
    c.eq("strided all_reduce premul leaves the gaps", big[1::2], inputs[rank][1::2])
    # reduce: the root gets the sum, the others keep their input
    root = world - 1
    x = inputs[rank].clone()
    dist.reduce(x, dst=root, op=dist._make_nccl_premul_sum(factor(rank)))
    c.eq("reduce premul", x, want(f32, inputs) if rank == root else inputs[rank])
    # reduce_scatter (tensor and list): inputs are left as they were
    n = 13
    full = [values(f32, "SUM", r, world * n, salt=3) for r in range(world)]
    total = want(f32, full)
    inp = full[rank].clone()
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(factor(rank)))
    c.eq("reduce_scatter_tensor premul", out, total[rank * n:(rank + 1) * n])
    c.eq("reduce_scatter_tensor premul leaves the input", inp, full[rank])
    ins = [full[rank][d * n:(d + 1) * n].clone() for d in range(world)]
    out = torch.empty(n)
    dist.reduce_scatter(out, ins, op=dist._make_nccl_premul_sum(factor(rank)))
    c.eq("reduce_scatter premul", out, total[rank * n:(rank + 1) * n])
    c.eq("reduce_scatter premul leaves the inputs", torch.cat(ins), full[rank])
    # coalesced: all_reduce_coalesced and the coalescing manager's reduce_scatter_tensor
    xs = [inputs[rank][:5].clone(), inputs[rank][5:12].clone()]
    dist.all_reduce_coalesced(xs, op=dist._make_nccl_premul_sum(factor(rank)))
    total = want(f32, inputs)
    c.eq("all_reduce_coalesced premul", torch.cat(xs), total[:12])
    from torch.distributed.distributed_c10d import _coalescing_manager

    outs = [torch.empty(n), torch.empty(n)]
    srcs = [full[rank].clone(), (2 * full[rank]).clone()]
    with _coalescing_manager():
        for o, x in zip(outs, srcs):
            dist.reduce_scatter_tensor(o, x, op=dist._make_nccl_premul_sum(factor(rank)))
    scaled = want(f32, full)
    c.eq("coalesced reduce_scatter_tensor premul", torch.cat(outs),
         torch.cat([scaled[rank * n:(rank + 1) * n], 2 * scaled[rank * n:(rank + 1) * n]]))
    c.eq("coalesced reduce_scatter_tensor premul leaves the inputs", srcs[1], 2 * full[rank])
    # outside autograd, as the collective is: a leaf that requires grad
    leaf = inputs[rank].clone().requires_grad_()
    dist.all_reduce(leaf, op=dist._make_nccl_premul_sum(factor(rank)))
    c.true("premul on a leaf that requires grad: no grad_fn", leaf.grad_fn is None)
    c.eq("premul on a leaf that requires grad", leaf.detach(), total)
    return c.count, c.failures


def p2p(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if os.environ.get("RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES") == "0":
        # every send read by its receiver is split (the case's point)
        split = rustccl.stats()["thresholds"]["shm_split_send_min_bytes"]
        c.eq("split-send threshold", torch.tensor(split), torch.tensor(0))
    # blocking send / recv around a ring, with tags
    for tag in (0, 7):
        out = torch.full((100,), float(rank * 10 + tag))
        inp = torch.empty(100)
        if rank % 2 == 0:
            dist.send(out, nxt, tag=tag)
            dist.recv(inp, prv, tag=tag)
        else:
            dist.recv(inp, prv, tag=tag)
            dist.send(out, nxt, tag=tag)
        c.eq(f"send/recv tag {tag}", inp, torch.full((100,), float(prv * 10 + tag)))
    # isend / irecv with tags received out of order
    big = torch.arange(1 << 18, dtype=torch.float64) + rank
    reqs = [dist.isend(torch.tensor([rank, 1]), nxt, tag=1), dist.isend(torch.tensor([rank, 2]), nxt, tag=2),
            dist.isend(big, nxt, tag=3)]
    a, b2, big_in = torch.empty(2, dtype=torch.long), torch.empty(2, dtype=torch.long), torch.empty(1 << 18, dtype=torch.float64)
    r3 = dist.irecv(big_in, prv, tag=3)
    r2 = dist.irecv(b2, prv, tag=2)
    r1 = dist.irecv(a, prv, tag=1)
    for r in (r1, r2, r3, *reqs):
        r.wait()
    c.eq("irecv tag 1", a, torch.tensor([prv, 1]))
    c.eq("irecv tag 2", b2, torch.tensor([prv, 2]))
    c.eq("irecv big", big_in, torch.arange(1 << 18, dtype=torch.float64) + prv)
    # one tag, messages of mixed sizes in flight: they arrive in the order sent
    # (small ones are written by the calling thread when nothing is queued
    # before them; ones larger than the test's 64 KiB ring, the rendezvous
    # one (1.2 MB) and those sent behind them go through the engine's thread)
    sizes = [3, 40000, 5, 1, 300000, 7, 20000, 2, 9]
    outs = [torch.arange(n, dtype=torch.float32) + 1000 * i + rank for i, n in enumerate(sizes)]
    sends = [dist.isend(t, nxt, tag=9) for t in outs]
    ins = [torch.empty(n) for n in sizes]
    for w in [dist.irecv(t, prv, tag=9) for t in ins] + sends:
        w.wait()
    for i, (n, t) in enumerate(zip(sizes, ins)):
        c.eq(f"in-order message {i} ({n} floats)", t, torch.arange(n, dtype=torch.float32) + 1000 * i + prv)
    # batch_isend_irecv: exchange with both neighbours
    s1, s2 = torch.full((5,), float(rank)), torch.full((6,), float(rank) + 0.5)
    r_from_prv, r_from_nxt = torch.empty(5), torch.empty(6)
    ops = [dist.P2POp(dist.isend, s1, nxt), dist.P2POp(dist.isend, s2, prv),
           dist.P2POp(dist.irecv, r_from_prv, prv), dist.P2POp(dist.irecv, r_from_nxt, nxt)]
    if world == 2:  # both messages to the one peer: give them distinct sizes, tags keep order
        ops = [dist.P2POp(dist.isend, s1, nxt, tag=1), dist.P2POp(dist.isend, s2, prv, tag=2),
               dist.P2POp(dist.irecv, r_from_prv, prv, tag=1), dist.P2POp(dist.irecv, r_from_nxt, nxt, tag=2)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    c.eq("batch_isend_irecv from prev", r_from_prv, torch.full((5,), float(prv)))
    c.eq("batch_isend_irecv from next", r_from_nxt, torch.full((6,), float(nxt) + 0.5))
    # recv from any source: rank 0 collects one message from everyone else
    if rank == 0:
        seen = []
        for _ in range(world - 1):
            t = torch.empty(1)
            src = dist.recv(t, tag=5)
            c.true(f"any-source recv reports sender {src}", float(t.item()) == float(src) * 3)
            seen.append(src)
        c.true(f"any-source recv saw every rank once: {sorted(seen)}", sorted(seen) == list(range(1, world)))
    else:
        dist.send(torch.tensor([rank * 3.0]), 0, tag=5)
    if os.environ.get("RUSTCCL_SHM_ATTACH_MIN_BYTES") == "0" and rank < 2:
        # A 2 MiB send goes through rank 0's staging area: complete before
        # its receive is posted, its tensor free to change at once.
        st = rustccl.stats()["thresholds"]
        # the staging area as set (the test's launch sets it: left to the
        # host, ranks of 1-2 threads have none)
        area = int(os.environ["RUSTCCL_SHM_STAGED_SEND_MAX_BYTES"])
        c.true(f"staged sends in force: {st}", st.get("shm_staged_send_min_bytes") == 128 << 10 and st.get("shm_staged_send_max_bytes") == area)
        if rank == 0:
            x = torch.arange(1 << 19, dtype=torch.float32)
            w = dist.isend(x, 1, tag=11)
            t0 = time.monotonic()
            while not w.is_completed() and time.monotonic() - t0 < 10:
                time.sleep(0.001)
            c.true("a staged send completes before its receive is posted", w.is_completed())
            x.fill_(-1.0)
            dist.barrier()
            w.wait()
        else:
            dist.barrier()
            y = torch.empty(1 << 19)
            dist.recv(y, 0, tag=11)
            c.eq("staged message", y, torch.arange(1 << 19, dtype=torch.float32))
    else:
        dist.barrier()
    dist.barrier()
    return c.count, c.failures


def p2p_two_hosts(rank: int, world: int) -> tuple[int, list[str]]:
    """On two simulated hosts (launch's RUSTCCL_TEST_HOSTS=2): each rank has
    shared-memory peers and TCP peers, and its point-to-point engine sleeps
    on its futex word while a watcher thread polls the sockets. Sends to
    the other host larger than a socket's buffer must resume when the
    socket drains (the watcher's writable event)."""
    c = Checker(rank)
    half = world // 2
    far, near = (rank + half) % world, rank ^ 1
    for n in (1 << 16, 1 << 21, 1 << 23):
        # both directions at once to the other host, then one way (the
        # receiver posts late, so the sender's socket fills and waits)
        out = torch.arange(n, dtype=torch.float32) + 7 * rank
        got = torch.empty(n)
        for w in [dist.isend(out, far, tag=1), dist.irecv(got, far, tag=1)]:
            w.wait()
        c.eq(f"two-way {n} floats from rank {far}", got, torch.arange(n, dtype=torch.float32) + 7 * far)
        if rank < half:
            dist.send(out, far, tag=2)
        else:
            time.sleep(0.2)
            dist.recv(got, far, tag=2)
            c.eq(f"one-way {n} floats from rank {far}", got, torch.arange(n, dtype=torch.float32) + 7 * far)
        # within the host at the same time as across
        near_in = torch.empty(n)
        ops = [dist.P2POp(dist.isend, out, far, tag=3), dist.P2POp(dist.irecv, got, far, tag=3),
               dist.P2POp(dist.isend, out, near, tag=4), dist.P2POp(dist.irecv, near_in, near, tag=4)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.eq(f"batched {n} floats from rank {far}", got, torch.arange(n, dtype=torch.float32) + 7 * far)
        c.eq(f"batched {n} floats from rank {near}", near_in, torch.arange(n, dtype=torch.float32) + 7 * near)
    dist.barrier()
    return c.count, c.failures


def streamed_blocks(rank: int, world: int) -> tuple[int, list[str]]:
    """all_to_all, gather and scatter blocks of many 16 KiB chunks between
    processes, through their senders' shared-memory input slots (the
    case's settings: slots of 256 KiB, blocks below the read threshold,
    too large for the small slots): the sender copies a block in after its
    first publish and its receivers copy each chunk once its ready flag
    holds the operation's number. New values every round, so a receiver
    that took an earlier operation's flag as ready would copy stale bytes;
    with RUSTCCL_SHM_BLOCK_WAIT_US=0 every wait a chunk needs is handed to
    the rank's own thread, which waits for the whole block and copies it
    again."""
    c = Checker(rank)
    wait = os.environ.get("RUSTCCL_SHM_BLOCK_WAIT_US")
    got = rustccl.stats()["thresholds"].get("shm_block_wait_us")
    c.true(f"block wait {got} == {wait}", wait is None or got == int(wait))

    def block(src: int, dst: int, n: int, rnd: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.int32) * 7 + src * 1_000_003 + dst * 10_007 + rnd * 100_019

    # int32 elements: 4 bytes to 160 KB, around the 16 KiB chunks
    lens = [1, 4095, 4096, 4113, 12_500, 25_000, 40_000]
    for rnd in range(6):
        def count(s: int, d: int) -> int:
            return lens[(s + 2 * d + rnd) % len(lens)]
        ins = torch.cat([block(rank, d, count(rank, d), rnd) for d in range(world)])
        out = torch.full((sum(count(s, rank) for s in range(world)),), -1, dtype=torch.int32)
        dist.all_to_all_single(out, ins, [count(s, rank) for s in range(world)], [count(rank, d) for d in range(world)])
        c.eq(f"all_to_all round {rnd}", out, torch.cat([block(s, rank, count(s, rank), rnd) for s in range(world)]))
        for root in range(world):
            n = lens[(rnd + root) % len(lens)]
            gl = [torch.full((n,), -1, dtype=torch.int32) for _ in range(world)] if rank == root else None
            dist.gather(block(rank, root, n, rnd), gl, dst=root)
            if rank == root:
                for s in range(world):
                    c.eq(f"gather round {rnd} root {root} from {s}", gl[s], block(s, root, n, rnd))
            sl = [block(root, d, n, rnd + 1) for d in range(world)] if rank == root else None
            got = torch.full((n,), -1, dtype=torch.int32)
            dist.scatter(got, sl, src=root)
            c.eq(f"scatter round {rnd} root {root}", got, block(root, rank, n, rnd + 1))
    ops = rustccl.stats()["ops"]
    for op in ("all_to_all", "gather", "scatter"):
        # (A gather's or scatter's blocks that fit a small slot together
        # take the one-step algorithm.)
        algos = ops.get(op, {}).get("algorithms", {})
        c.true(f"{op} through the slots: {ops.get(op)}", algos.get("shm_attach", 0) > 0 and set(algos) <= {"shm_attach", "shm_one_round"})
    dist.barrier()
    return c.count, c.failures


def beside_busy_processes(rank: int, world: int) -> int:
    """Ping-pongs between ranks 0 and 1 (distinct payloads, 8 B - 2 MiB)
    and all_reduces / broadcasts on every rank while busy processes take
    the cores: the waits sleep and drive the engine themselves there.
    Returns the number of checks made."""
    checks = 0
    for rnd in range(3):
        for n in (2, 8 << 10, 512 << 10):
            if rank in (0, 1):
                peer = 1 - rank
                mine = torch.arange(n, dtype=torch.float32) + 1000 * rank + rnd
                got = torch.empty(n)
                if rank == 0:
                    dist.send(mine, peer)
                    dist.recv(got, peer)
                else:
                    dist.recv(got, peer)
                    dist.send(mine, peer)
                assert torch.equal(got, torch.arange(n, dtype=torch.float32) + 1000 * peer + rnd), (rnd, n)
                checks += 1
            x = torch.full((n,), float(rank + 1 + rnd))
            dist.all_reduce(x)
            assert torch.equal(x, torch.full((n,), float(world * (world + 1) // 2 + world * rnd))), (rnd, n)
            y = torch.arange(n, dtype=torch.float32) * (rnd + 1) if rank == 0 else torch.zeros(n)
            dist.broadcast(y, 0)
            assert torch.equal(y, torch.arange(n, dtype=torch.float32) * (rnd + 1)), (rnd, n)
            checks += 2
    return checks
