"""Rank-side bodies of the shared-tensor tests (RUSTCCL_SHM_TENSORS=1, see
test_shm_tensors.py): collectives and sends on tensors in the ranks' shared
arenas, read by the peers with a plain copy (and reduced in place), mixed
with tensors outside them (numpy memory, read through the kernel), against
references computed locally; and a forked child that cannot touch its
parent's tensors."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import rustccl

from refs import Checker, reference, values

MIB = 1 << 20


def _in_arena(t: torch.Tensor) -> bool:
    for line in open("/proc/self/maps"):
        if "rustccl-tensors" in line:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= t.data_ptr() < hi:
                return True
    return False


def _outside(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in numpy's memory (not in the arena)."""
    return torch.from_numpy(t.numpy().copy()) if t.dtype != torch.bfloat16 else t.clone()


def shared_collectives(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    st = rustccl.stats()
    c.true(f"every peer's arena mapped: {st['thresholds']['shm_peer_tensor_arenas']}", st["thresholds"]["shm_peer_tensor_arenas"] == world - 1)
    c.true("the host's shared thresholds", st["thresholds"]["shm_attach_min_bytes"] == 256 << 10 and st["thresholds"]["shm_all_reduce_attach_min_bytes"] == 4 * MIB)
    red = st["thresholds"]["shm_reduce_attach_min_bytes"]
    c.true(f"reduce reads from {red} bytes", red == (256 << 10 if world > 4 else 16 * MIB))
    blocks = st["thresholds"]["shm_block_read_min_bytes"]
    c.true(f"blocks read over {blocks} bytes", blocks == (32 << 10 if world > 4 else 256 << 10))
    before = st["shared_tensors"]["in_use_bytes"]
    big = torch.empty(MIB, dtype=torch.uint8)
    small = torch.empty(1000, dtype=torch.uint8)
    c.true("a 1 MiB tensor is in the arena, a 1000-byte one is not", _in_arena(big) and not _in_arena(small))
    c.true("in use grows by the tensor", rustccl.stats()["shared_tensors"]["in_use_bytes"] >= before + MIB)
    del big, small
    f32 = torch.float32
    # all_reduce reads (in place: peek) from 4 MiB, the others from 256 KiB.
    for dtype, opname, n in [(f32, "SUM", 5 * MIB // 4 + 3), (torch.bfloat16, "MAX", 5 * MIB // 2), (torch.float64, "AVG", MIB // 8 * 5), (f32, "SUM", 300_000)]:
        for where in ("shared", "outside"):
            x = values(dtype, opname, rank, n)
            if where == "outside":
                x = _outside(x)
            op = getattr(dist.ReduceOp, opname)
            dist.all_reduce(x, op=op)
            c.eq(f"all_reduce {dtype} {opname} n={n} {where}", x, reference(dtype, opname, [values(dtype, opname, r, n) for r in range(world)]), opname)
            alg = rustccl.stats()["ops"]["all_reduce"]["algorithm"]
            c.true(f"all_reduce n={n}: {alg}", alg == ("shm_attach" if n * x.element_size() >= 4 * MIB else "shm_pipelined"))
    n = 400_000
    ins = [values(f32, "SUM", r, n * world) for r in range(world)]
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out, ins[rank])
    c.eq("reduce_scatter", out, sum(ins)[rank * n:(rank + 1) * n])
    c.true("reduce_scatter reads", rustccl.stats()["ops"]["reduce_scatter"]["algorithm"] == "shm_attach")
    for root in range(world):
        x = values(f32, "SUM", rank, n)
        dist.reduce(x, root)
        if rank == root:
            c.eq(f"reduce root {root}", x, sum(values(f32, "SUM", r, n) for r in range(world)))
        alg = rustccl.stats()["ops"]["reduce"]["algorithm"]
        c.true(f"1.6 MB reduce reads the peers with more than 4 ranks, else the slots: {alg}", alg == ("shm_attach" if world > 4 else "shm_pipelined"))
        x = values(f32, "SUM", rank, 2 * MIB // 4) if rank == root else torch.empty(2 * MIB // 4)
        dist.broadcast(x, root)
        c.eq(f"broadcast root {root}", x, values(f32, "SUM", root, 2 * MIB // 4))
        alg = rustccl.stats()["ops"]["broadcast"]["algorithm"]
        c.true(f"broadcast reads the root with two threads a rank or more: {alg}", alg == ("shm_attach" if st["thresholds"]["shm_threads"] > 1 else "shm_direct"))
        mine = values(f32, "SUM", rank, n)
        outs = [torch.empty(n) for _ in range(world)] if rank == root else None
        dist.gather(mine, outs, root)
        if rank == root:
            for r in range(world):
                c.eq(f"gather root {root} from {r}", outs[r], values(f32, "SUM", r, n))
        parts = [values(f32, "SUM", r + 10, n) for r in range(world)] if rank == root else None
        got = torch.empty(n)
        dist.scatter(got, parts, root)
        c.eq(f"scatter root {root}", got, values(f32, "SUM", rank + 10, n))
    gathered = torch.empty(n * world)
    dist.all_gather_into_tensor(gathered, values(f32, "SUM", rank, n))
    c.eq("all_gather", gathered, torch.cat([values(f32, "SUM", r, n) for r in range(world)]))
    c.true("all_gather reads", rustccl.stats()["ops"]["all_gather"]["algorithm"] == "shm_attach")
    # all_to_all with uneven blocks, some under the block threshold (slots),
    # some over it (read), from the arena and from outside it.
    count = lambda s, d: ((s + d) % 3) * 40_000 + 1000  # noqa: E731
    block = lambda s, d: torch.arange(count(s, d), dtype=f32) + 1000 * s + 100 * d  # noqa: E731
    for where in ("shared", "outside"):
        inp = torch.cat([block(rank, d) for d in range(world)])
        if where == "outside":
            inp = _outside(inp)
        out = torch.empty(sum(count(s, rank) for s in range(world)))
        dist.all_to_all_single(out, inp, [count(s, rank) for s in range(world)], [count(rank, d) for d in range(world)])
        c.eq(f"all_to_all {where}", out, torch.cat([block(s, rank) for s in range(world)]))
    return c.count, c.failures


def crowded_host(rank: int, world: int) -> tuple[int, list[str]]:
    """8 or more local ranks with 32 or more threads among them
    (RUSTCCL_SHM_THREADS=4 here): all_reduce reads shared tensors only
    from 8 MiB per rank and all_gather from 16 MiB (the pipelined slots
    below); with fewer threads (=1) from 4 MiB and 256 KiB as elsewhere."""
    c = Checker(rank)
    th = rustccl.stats()["thresholds"]
    crowded = world >= 8 and world * th["shm_threads"] >= 32
    want = (8 * MIB, 16 * MIB) if crowded else (4 * MIB, 256 << 10)
    got = (th["shm_all_reduce_attach_min_bytes"], th["shm_all_gather_attach_min_bytes"])
    c.true(f"all_reduce / all_gather read from {got}, want {want}", got == want)
    c.true("the other collectives still read from 256 KiB", th["shm_attach_min_bytes"] == 256 << 10)
    n = MIB // 4  # 1 MiB of float32 per rank
    gathered = torch.empty(n * world)
    dist.all_gather_into_tensor(gathered, values(torch.float32, "SUM", rank, n))
    c.eq("all_gather", gathered, torch.cat([values(torch.float32, "SUM", r, n) for r in range(world)]))
    alg = rustccl.stats()["ops"]["all_gather"]["algorithm"]
    c.true(f"1 MiB all_gather: {alg}", alg == ("shm_direct" if crowded else "shm_attach"))
    x = values(torch.float32, "SUM", rank, 4 * n)
    dist.all_reduce(x)
    c.eq("all_reduce 4 MiB", x, sum(values(torch.float32, "SUM", r, 4 * n) for r in range(world)))
    alg = rustccl.stats()["ops"]["all_reduce"]["algorithm"]
    c.true(f"4 MiB all_reduce: {alg}", alg == ("shm_pipelined" if crowded else "shm_attach"))
    return c.count, c.failures


def shared_sends(rank: int, world: int) -> tuple[int, list[str]]:
    """A ring of sends (tags, any-source receives), shared and not: a
    shared tensor goes by rendezvous (the receiver copies it out of the
    sender's arena), one outside by the staging area."""
    c = Checker(rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for k, (n, where) in enumerate([(3 * MIB // 4, "shared"), (3 * MIB // 4, "outside"), (300_000, "shared"), (9 * MIB // 4, "shared")]):
        x = torch.arange(n, dtype=torch.float32) + 7 * rank + k
        if where == "outside":
            x = _outside(x)
        c.true(f"send {k} {where}: in the arena or not", _in_arena(x) == (where == "shared"))
        got = torch.empty(n)
        if rank % 2 == 0:
            dist.send(x, nxt, tag=k)
            src = dist.recv(got, None if k % 2 else prv, tag=k)
        else:
            src = dist.recv(got, None if k % 2 else prv, tag=k)
            dist.send(x, nxt, tag=k)
        c.true(f"recv {k} from {src}", src == prv)
        c.eq(f"send/recv {k} {where} n={n}", got, torch.arange(n, dtype=torch.float32) + 7 * prv + k)
        # batched, both directions at once
        got2 = torch.empty(n)
        ops = [dist.P2POp(dist.isend, x, nxt, tag=100 + k), dist.P2POp(dist.irecv, got2, prv, tag=100 + k)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.eq(f"batch_isend_irecv {k} {where}", got2, torch.arange(n, dtype=torch.float32) + 7 * prv + k)
    return c.count, c.failures


def shared_send_staging(rank: int, world: int) -> tuple[int, list[str]]:
    """RUSTCCL_SHM_STAGE_SHARED_SENDS=1: a send of a shared tensor is
    staged (it completes before its receive is posted, and the sender may
    reuse the tensor at once); =0 (the default): the receiver reads it out
    of the sender's tensor, so the send waits for the receive, even with
    a staging area (the launch sets one: RUSTCCL_SHM_STAGED_SEND_MAX_BYTES)."""
    c = Checker(rank)
    staged = os.environ.get("RUSTCCL_SHM_STAGE_SHARED_SENDS") == "1"
    th = rustccl.stats()["thresholds"]
    c.true("the setting in stats()", th["shm_stage_shared_sends"] == int(staged))
    area = int(os.environ["RUSTCCL_SHM_STAGED_SEND_MAX_BYTES"])
    c.true(f"the staging area as set: {th['shm_staged_send_max_bytes']}", th["shm_staged_send_max_bytes"] == area)
    n = MIB // 4
    want = torch.arange(n, dtype=torch.float32) + 3
    if rank == 0:
        x = want.clone()
        c.true("the send's tensor is in the arena", _in_arena(x))
        w = dist.isend(x, 1, tag=9)
        deadline = time.monotonic() + 1.5
        while not w.is_completed() and time.monotonic() < deadline:
            time.sleep(0.01)
        c.true(f"the send completed before its receive: {w.is_completed()}", w.is_completed() == staged)
        w.wait()
        x.fill_(-1.0)
    else:
        time.sleep(2.5)
        got = torch.empty(n)
        dist.recv(got, 0, tag=9)
        c.eq("received", got, want)
    dist.barrier()
    return c.count, c.failures


def fork_keeps_tensors_apart(rank: int, world: int) -> tuple[int, list[str]]:
    """A child forked after the arena exists (as DataLoader workers are)
    writes its inherited tensors and allocates new ones privately: the
    parent's tensors and its next tensors are unchanged."""
    c = Checker(rank)
    # OpenMP's threads do not survive fork (torch's ops hang in a child
    # forked after a parallel region, with or without rustccl): one
    # thread, as DataLoader workers run.
    torch.set_num_threads(1)
    x = torch.full((MIB,), 7.0)
    c.true("parent's tensor in the arena", _in_arena(x))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = True
        try:
            x.fill_(1.0)
            ys = [torch.full((MIB,), 9.0) for _ in range(4)]
            ok = not any(_in_arena(y) for y in ys) and all(float(y.sum()) == 9.0 * MIB for y in ys) and float(x.sum()) == MIB
            del ys
        except BaseException:  # noqa: BLE001 - reported through the pipe
            ok = False
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    child_ok = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    c.true("the child wrote privately and allocated outside the arena", child_ok == b"1")
    c.eq("the parent's tensor is unchanged", x, torch.full((MIB,), 7.0))
    z = torch.full((MIB,), float(rank + 1))
    c.true("the parent still allocates from the arena", _in_arena(z))
    dist.all_reduce(z)
    c.eq("the group still works", z, torch.full((MIB,), float(world * (world + 1) // 2)))
    return c.count, c.failures


def settings_after_import(rank: int, world: int) -> tuple[int, list[str]]:
    """Run with init="none": a setting the script sets after `import
    rustccl` (which created the arena) still counts when its group starts
    (the arena must not read every setting at import)."""
    from datetime import timedelta

    c = Checker(rank)
    os.environ["RUSTCCL_SHM_SMALL_BYTES"] = "8192"
    dist.init_process_group("rustccl", timeout=timedelta(seconds=60))
    th = rustccl.stats()["thresholds"]
    c.true(f"small slots from the setting made after the import: {th['shm_small_slot_bytes']}", th["shm_small_slot_bytes"] == 8192)
    c.true("shared tensors on", rustccl.stats()["shared_tensors"] is not None and _in_arena(torch.empty(MIB, dtype=torch.uint8)))
    x = torch.full((MIB,), float(rank + 1))
    dist.all_reduce(x)
    c.eq("all_reduce", x, torch.full((MIB,), float(world * (world + 1) // 2)))
    return c.count, c.failures


def ddp_matches_gloo(rank: int, world: int) -> tuple[int, list[str]]:
    """DDP with its gradient buckets in the arena (8 MiB: the all_reduce
    reads and reduces the peers' buckets in place) against DDP over gloo,
    same model, data and seeds."""
    import copy

    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = Checker(rank)
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 512))
    m_r, m_g = copy.deepcopy(base), copy.deepcopy(base)
    d_r, d_g = DDP(m_r, bucket_cap_mb=8), DDP(m_g, process_group=gloo, bucket_cap_mb=8)
    o_r, o_g = torch.optim.SGD(d_r.parameters(), lr=0.01), torch.optim.SGD(d_g.parameters(), lr=0.01)
    for step in range(3):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(32, 512, generator=g), torch.randn(32, 512, generator=g)
        for d, o in ((d_r, o_r), (d_g, o_g)):
            o.zero_grad()
            nn.functional.mse_loss(d(x), y).backward()
            o.step()
        for (n, p_r), p_g in zip(d_r.module.named_parameters(), d_g.module.parameters()):
            c.true(f"step {step} {n}: in the arena {_in_arena(p_r.grad)}, max diff {(p_r - p_g).abs().max().item():.3g}",
                   torch.allclose(p_r, p_g, rtol=1e-5, atol=1e-6))
    c.true("all_reduce read the peers' buckets", rustccl.stats()["ops"]["all_reduce"]["algorithm"] == "shm_attach")
    return c.count, c.failures
