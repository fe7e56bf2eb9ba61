"""Rank-side bodies: init methods and groups, DDP parity with gloo, error
handling, and the torch-free numpy communicator."""

from __future__ import annotations

import copy
import os
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from refs import Checker, reference, values


def basic(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    c.true("backend name", dist.get_backend() == "rustccl")
    c.true("rank/size", dist.get_rank() == rank and dist.get_world_size() == world)
    x = values(torch.float32, "SUM", rank, 33)
    dist.all_reduce(x)
    c.eq("all_reduce", x, reference(torch.float32, "SUM", [values(torch.float32, "SUM", r, 33) for r in range(world)]))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    c.true(f"all_gather_object {objs}", objs == [{"rank": r} for r in range(world)])
    dist.barrier()
    return c.count, c.failures


def groups(rank: int, world: int) -> tuple[int, list[str]]:
    """Several groups alive at once, each its own communicator."""
    c = Checker(rank)
    evens = list(range(0, world, 2))
    odds = list(range(1, world, 2))
    g_even = dist.new_group(evens)
    g_odd = dist.new_group(odds)
    g_rev = dist.new_group(list(reversed(range(world))))
    g_all = dist.new_group()
    mine = g_even if rank in evens else g_odd
    members = evens if rank in evens else odds
    for k in range(3):  # interleave groups
        x = torch.full((10,), float(rank + k))
        dist.all_reduce(x, group=mine)
        c.eq(f"subgroup all_reduce {k}", x, torch.full((10,), float(sum(r + k for r in members))))
        y = torch.full((4,), float(rank))
        dist.all_reduce(y, group=g_all)
        c.eq(f"second full group {k}", y, torch.full((4,), float(sum(range(world)))))
        z = torch.full((3,), float(rank))
        dist.broadcast(z, src=world - 1, group=g_rev)
        c.eq(f"reversed group broadcast {k}", z, torch.full((3,), float(world - 1)))
    # group ranks vs global ranks in rooted ops and p2p
    if len(members) > 1:
        t = torch.full((2,), float(rank))
        dist.broadcast(t, src=members[-1], group=mine)
        c.eq("subgroup broadcast from global rank", t, torch.full((2,), float(members[-1])))
        gl = [torch.empty(1) for _ in members] if rank == members[0] else None
        dist.gather(torch.tensor([float(rank)]), gather_list=gl, dst=members[0], group=mine)
        if gl is not None:
            c.eq("subgroup gather", torch.cat(gl), torch.tensor([float(m) for m in members]))
    dist.barrier(group=mine)
    for g in (g_even, g_odd, g_rev, g_all):
        if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    x = torch.ones(1)
    dist.all_reduce(x)
    c.eq("default group after destroying subgroups", x, torch.full((1,), float(world)))
    return c.count, c.failures


def reinit(rank: int, world: int, cycles: int) -> tuple[int, list[str]]:
    """init / destroy cycles in one process (launched with init="none")."""
    from datetime import timedelta

    c = Checker(rank)
    port = int(os.environ["MASTER_PORT"])
    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=timedelta(seconds=30))
    for k in range(cycles):
        dist.init_process_group("rustccl", store=store, rank=rank, world_size=world)
        x = torch.full((5,), float(rank + k))
        dist.all_reduce(x)
        c.eq(f"cycle {k}", x, torch.full((5,), float(sum(r + k for r in range(world)))))
        dist.destroy_process_group()
    return c.count, c.failures


SIZE = 48


def toy_model() -> nn.Module:
    """The seeds' toy model: three Linear(SIZE, SIZE) with ReLU."""
    return nn.Sequential(nn.Linear(SIZE, SIZE), nn.ReLU(), nn.Linear(SIZE, SIZE), nn.ReLU(), nn.Linear(SIZE, SIZE))


def ddp_parity(rank: int, world: int, steps: int) -> tuple[int, list[str]]:
    """The same model, data and seeds under DDP over rustccl and over gloo:
    gradients and parameters must match at every step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = Checker(rank)
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    base = toy_model()
    m_r, m_g = copy.deepcopy(base), copy.deepcopy(base)
    # Different initial weights per rank: DDP must broadcast rank 0's.
    with torch.no_grad():
        for p in list(m_r.parameters()) + list(m_g.parameters()):
            p.add_(rank)
    d_r = DDP(m_r, bucket_cap_mb=0.01)  # tiny buckets: several all_reduces per step
    d_g = DDP(m_g, process_group=gloo, bucket_cap_mb=0.01)
    o_r = torch.optim.SGD(d_r.parameters(), lr=0.01)
    o_g = torch.optim.SGD(d_g.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, SIZE, generator=g)
        y = torch.randn(16, SIZE, generator=g)
        for d, o in ((d_r, o_r), (d_g, o_g)):
            o.zero_grad()
            loss_fn(d(x), y).backward()
        for (n, p_r), p_g in zip(d_r.module.named_parameters(), d_g.module.parameters()):
            c.true(f"step {step} grad {n} allclose (max diff {(p_r.grad - p_g.grad).abs().max().item():.3g})",
                   torch.allclose(p_r.grad, p_g.grad, rtol=1e-5, atol=1e-6))
        o_r.step()
        o_g.step()
    for (n, p_r), p_g in zip(d_r.module.named_parameters(), d_g.module.parameters()):
        c.true(f"final param {n} allclose", torch.allclose(p_r, p_g, rtol=1e-5, atol=1e-6))
    # parameters are identical on every rank
    flat = torch.cat([p.detach().flatten() for p in d_r.module.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    c.true("replicas identical across ranks", all(torch.equal(everyone[0], e) for e in everyone))
    return c.count, c.failures


def _expect_error(c: Checker, what: str, fn, *needles: str) -> None:
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        ok = all(n in msg for n in needles)
        c.true(f"{what}: message {msg[:300]!r} should contain {needles}", ok)
        return
    except Exception as e:  # noqa: BLE001
        c.true(f"{what}: expected RuntimeError, got {type(e).__name__}: {e}", False)
        return
    c.true(f"{what}: no error raised", False)


def errors(rank: int, world: int) -> tuple[int, list[str]]:
    """Unsupported input raises a RuntimeError naming rustccl, the
    collective and the cause; the group keeps working after each."""
    c = Checker(rank)

    def still_works(k):
        x = torch.full((3,), float(rank + k))
        dist.all_reduce(x)
        c.eq(f"group works after error {k}", x, torch.full((3,), float(sum(r + k for r in range(world)))))

    _expect_error(c, "sparse AVG", lambda: dist.all_reduce(torch.ones(4).to_sparse(), op=dist.ReduceOp.AVG),
                  "rustccl", "all_reduce", "only ReduceOp.SUM")
    still_works(0)
    f8 = torch.ones(4).to(torch.float8_e4m3fn)
    _expect_error(c, "float8 reduction", lambda: dist.all_reduce(f8), "rustccl", "all_reduce", "float8_e4m3fn")
    still_works(1)
    _expect_error(c, "bitwise op on float", lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND), "rustccl", "all_reduce", "BAND")
    still_works(2)
    _expect_error(c, "AVG on bool", lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG),
                  "rustccl", "all_reduce", "AVG")
    still_works(3)
    _expect_error(c, "reduction of uint32", lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint32)),
                  "rustccl", "all_reduce", "uint32")
    still_works(4)
    outs = [torch.empty(4) for _ in range(world)]
    outs[-1] = torch.empty(3)
    _expect_error(c, "wrong output size", lambda: dist.all_gather(outs, torch.ones(4)), "rustccl", "all_gather", "elements")
    still_works(5)
    _expect_error(c, "premul sum on integers",
                  lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)),
                  "rustccl", "all_reduce", "PREMUL_SUM", "float32")
    # a coalesced call checks every tensor before scaling any
    first = torch.ones(3)
    _expect_error(c, "premul sum on an expanded tensor",
                  lambda: dist.all_reduce_coalesced([first, torch.ones(1).expand(3)], op=dist._make_nccl_premul_sum(2.0)),
                  "rustccl", "all_reduce_coalesced", "share memory")
    c.eq("premul error leaves the other tensors alone", first, torch.ones(3))
    still_works(6)
    _expect_error(c, "all_to_all_single bad splits",
                  lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world), input_split_sizes=[5] * world),
                  "rustccl", "all_to_all", "split")
    still_works(7)
    # uint32 / complex move as bytes where nothing is reduced
    u = (torch.arange(6) + rank).to(torch.uint32)
    dist.broadcast(u, src=0)
    c.true("uint32 broadcast", torch.equal(u.long(), torch.arange(6)))
    f8 = (torch.arange(4) + rank).to(torch.float8_e4m3fn)
    dist.broadcast(f8, src=world - 1)
    c.true("float8 broadcast", torch.equal(f8.float(), (torch.arange(4) + world - 1).float()))
    return c.count, c.failures


def numpy_api(rank: int, world: int, store_dir: str) -> tuple[int, list[str]]:
    """The torch-free communicator on numpy arrays (launched with init="none")."""
    import rustccl

    c = Checker(rank)
    comm = rustccl.Communicator.bootstrap(rustccl.FileStore(store_dir), rank, world, 60.0, "numpy")
    c.true("repr", "rank=" in repr(comm))
    x = np.arange(10, dtype=np.float32) + rank
    comm.all_reduce(x)
    c.true(f"all_reduce {x}", np.array_equal(x, sum(np.arange(10, dtype=np.float32) + r for r in range(world))))
    m = np.array([rank, -rank], dtype=np.int64)
    comm.all_reduce(m, op="max")
    c.true("all_reduce max", np.array_equal(m, np.array([world - 1, 0])))
    b = np.full(5, rank, dtype=np.float64)
    comm.broadcast(b, root=world - 1)
    c.true("broadcast", np.array_equal(b, np.full(5, world - 1.0)))
    out = np.empty(3 * world, dtype=np.int32)
    comm.all_gather(out, np.full(3, rank, dtype=np.int32))
    c.true("all_gather", np.array_equal(out, np.repeat(np.arange(world, dtype=np.int32), 3)))
    rs = np.empty(2, dtype=np.float32)
    comm.reduce_scatter(rs, np.ones(2 * world, dtype=np.float32) * (rank + 1))
    c.true("reduce_scatter", np.array_equal(rs, np.full(2, sum(range(1, world + 1)), dtype=np.float32)))
    a2a = np.empty(world, dtype=np.int64)
    comm.all_to_all(a2a, np.arange(world, dtype=np.int64) + 10 * rank)
    c.true("all_to_all", np.array_equal(a2a, np.array([10 * s + rank for s in range(world)])))
    # gather and scatter take one array per rank or one flat array (as
    # all_gather does), at the root only.
    root = world - 1
    mine = np.full(2, rank, dtype=np.float32)
    want = np.repeat(np.arange(world, dtype=np.float32), 2)
    flat = np.zeros(2 * world, dtype=np.float32) if rank == root else None
    comm.gather(mine, flat, root=root)
    listed = [np.zeros(2, dtype=np.float32) for _ in range(world)] if rank == root else None
    comm.gather(mine, listed, root=root)
    if rank == root:
        c.true(f"gather flat {flat}", np.array_equal(flat, want))
        c.true("gather list", np.array_equal(np.concatenate(listed), want))
    src = (np.arange(2 * world, dtype=np.float32) + 100) if rank == root else None
    got = np.zeros(2, dtype=np.float32)
    comm.scatter(got, src, root=root)
    c.true(f"scatter flat {got}", np.array_equal(got, np.arange(2 * rank, 2 * rank + 2, dtype=np.float32) + 100))
    got2 = np.zeros(2, dtype=np.float32)
    comm.scatter(got2, [src[2 * r:2 * r + 2] for r in range(world)] if rank == root else None, root=root)
    c.true("scatter list", np.array_equal(got2, got))
    if world > 1:
        if rank == 0:
            comm.send(np.array([7.0, 8.0]), dst=1, tag=4)
        elif rank == 1:
            got = np.empty(2)
            src = comm.recv(got, src=None, tag=4)
            c.true("recv any source", src == 0 and np.array_equal(got, [7.0, 8.0]))
        # A small receive is submitted holding the GIL; one whose message is
        # not in yet lets it go while it waits: this rank's main thread
        # runs Python meanwhile.
        if rank == 1:
            box = np.zeros(2)
            t = threading.Thread(target=comm.recv, args=(box, 0, 9))
            t.start()
            ticks, end = 0, time.monotonic() + 0.3
            while time.monotonic() < end:
                ticks += 1
            c.true(f"main thread ran while a receive waited ({ticks} ticks)", ticks > 1000 and t.is_alive())
        comm.barrier()
        if rank == 0:
            comm.send(np.array([5.0, 6.0]), dst=1, tag=9)
        elif rank == 1:
            t.join(30)
            c.true(f"waiting receive got its message {box}", not t.is_alive() and np.array_equal(box, [5.0, 6.0]))
        # Two threads each send and receive a stream on its own tag at once:
        # every message arrives, in order within its tag.
        if rank in (0, 1):
            n, got_by = 200, {}

            def stream(tag: int) -> None:
                if rank == 0:
                    for i in range(n):
                        comm.send(np.array([tag, i], dtype=np.int64), dst=1, tag=tag)
                else:
                    seen = []
                    for _ in range(n):
                        m = np.empty(2, dtype=np.int64)
                        comm.recv(m, src=0, tag=tag)
                        seen.append(m.tolist())
                    got_by[tag] = seen

            ts = [threading.Thread(target=stream, args=(tag,)) for tag in (21, 22)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            if rank == 1:
                c.true("two threads' streams arrive whole and in order",
                       all(got_by.get(tag) == [[tag, i] for i in range(n)] for tag in (21, 22)))
    # Every call lets go of its arrays' exports when it returns (the
    # engine's hold and the caller's alike): no reference is left behind.
    held = np.full(4, float(rank), dtype=np.float32)
    before = sys.getrefcount(held)
    for _ in range(50):
        comm.all_gather(np.empty(4 * world, dtype=np.float32), held)
        comm.broadcast(held, root=0)
    c.true("arrays released after the calls", sys.getrefcount(held) == before and np.array_equal(held, np.zeros(4)))
    try:
        comm.all_reduce(np.ones(2, dtype=np.complex64))
        c.true("complex reduction rejected", False)
    except ValueError as e:
        c.true(f"error names rustccl: {e}", "rustccl all_reduce" in str(e))
    # numpy arrays are read in place; every dtype, shape and subclass the
    # fast path takes gives numpy's own sum.
    for dt in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8):
        a = (np.arange(6, dtype=dt) + rank).reshape(2, 3)
        comm.all_reduce(a)
        want = sum((np.arange(6) + r) for r in range(world)).reshape(2, 3).astype(dt)
        c.true(f"all_reduce {np.dtype(dt).name} 2-D", a.dtype == dt and np.array_equal(a, want))
    flags = np.array([rank == 0, False, True])
    comm.all_reduce(flags, op="max")
    c.true("all_reduce bool max", np.array_equal(flags, [True, False, True]))
    scalar = np.array(float(rank))
    comm.all_reduce(scalar)
    c.true("all_reduce 0-d", float(scalar) == sum(range(world)))

    class Sub(np.ndarray):
        pass

    sub = np.full(3, rank + 1.0).view(Sub)
    comm.all_reduce(sub)
    c.true("all_reduce ndarray subclass", np.array_equal(np.asarray(sub), np.full(3, sum(range(1, world + 1)) * 1.0)))
    # Objects other than numpy arrays still go through DLPack.
    t = torch.full((3,), float(rank))
    comm.all_reduce(t)
    c.true("all_reduce torch tensor via DLPack", t.tolist() == [float(sum(range(world)))] * 3)
    # Arrays DLPack cannot describe are refused with the fix, on every rank
    # alike (the call never reaches the peers), and the group goes on.
    ro = np.ones(3, dtype=np.float32)
    ro.flags.writeable = False
    swapped = np.ones(3, dtype=">f4" if sys.byteorder == "little" else "<f4")
    for name, bad, why in (("read-only", ro, "read-only"), ("byte order", swapped, "byte order")):
        try:
            comm.all_reduce(bad)
            c.true(f"{name} array rejected", False)
        except ValueError as e:
            c.true(f"{name} error names rustccl and the fix: {e}", "rustccl all_reduce" in str(e) and why in str(e) and "pass" in str(e))
    after = np.full(2, 1.0)
    comm.all_reduce(after)
    c.true("group works after refused arrays", np.array_equal(after, np.full(2, float(world))))
    comm.barrier()
    comm.shutdown()
    return c.count, c.failures


def debug_detail(rank: int, world: int) -> dict:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the group and checks
    every call's shape and dtype across ranks (over a gloo helper group)
    before rustccl runs it: correct calls give correct results, and a
    shape mismatch fails on every rank with torch's own message."""
    import torch
    import torch.distributed as dist

    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    out = [torch.zeros(4) for _ in range(world)]
    dist.all_gather(out, torch.full((4,), float(rank)))
    b = torch.full((3,), float(rank))
    dist.broadcast(b, 0)
    dist.barrier()
    err = None
    try:
        dist.all_reduce(torch.ones(4 + rank))
    except Exception as e:  # noqa: BLE001 - the test inspects it
        err = f"{type(e).__name__}: {e}"
    after = torch.ones(2)
    dist.all_reduce(after)
    return {"sum": x.tolist(), "gathered": [t.tolist() for t in out], "bcast": b.tolist(), "err": err,
            "after": after.tolist(), "wrapped": type(dist.distributed_c10d._get_default_group()).__name__}
