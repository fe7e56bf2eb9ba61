"""Rank bodies of test_cuda_groups.py: split_group on a device-bound group
(every collective on the split groups, the parent still working, new_group
beside it), sparse all_reduce of CUDA tensors, and shrink_group on CUDA.
Launched with init="none": each body initialises with device_id."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

import rustccl  # noqa: F401
from refs import Checker


def _init(rank: int, world: int) -> torch.device:
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("rustccl", device_id=dev, rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}")
    return dev


def _collectives(c: Checker, tag: str, dev, group, ranks: list[int]) -> None:
    """Every collective on `group` (global `ranks`) against local references."""
    n = len(ranks)
    me = dist.get_rank(group)
    x = torch.full((1000,), float(ranks[me] + 1), device=dev)
    dist.all_reduce(x, group=group)
    c.eq(f"{tag} all_reduce", x.cpu(), torch.full((1000,), float(sum(r + 1 for r in ranks))))
    b = torch.full((7,), float(me), device=dev)
    dist.broadcast(b, group_src=n - 1, group=group)
    c.eq(f"{tag} broadcast", b.cpu(), torch.full((7,), float(n - 1)))
    out = torch.empty(n * 3, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3,), float(me), device=dev), group=group)
    c.eq(f"{tag} all_gather_into_tensor", out.cpu(), torch.arange(n).repeat_interleave(3).float())
    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * n, device=dev).float(), group=group)
    c.eq(f"{tag} reduce_scatter_tensor", rs.cpu(), (torch.arange(2 * n).float() * n)[2 * me:2 * me + 2])
    a2a = torch.empty(n, device=dev)
    dist.all_to_all_single(a2a, torch.full((n,), float(me), device=dev), group=group)
    c.eq(f"{tag} all_to_all_single", a2a.cpu(), torch.arange(n).float())
    r = torch.full((4,), float(me + 1), device=dev)
    dist.reduce(r, group_dst=0, group=group)
    if me == 0:
        c.eq(f"{tag} reduce", r.cpu(), torch.full((4,), float(n * (n + 1) / 2)))
    if n > 1:
        if me == 0:
            dist.send(torch.full((3,), 5.0, device=dev), group_dst=1, group=group)
        elif me == 1:
            got = torch.zeros(3, device=dev)
            dist.recv(got, group_src=0, group=group)
            c.eq(f"{tag} send/recv", got.cpu(), torch.full((3,), 5.0))
    dist.barrier(group=group)


def split(rank: int, world: int) -> tuple[int, list[str]]:
    dev = _init(rank, world)
    c = Checker(rank)
    halves = [list(range(0, world // 2)), list(range(world // 2, world))]
    mine = halves[0] if rank in halves[0] else halves[1]
    sub = dist.split_group(split_ranks=halves)
    c.true("split returned a group", sub is not None)
    c.true(f"split size {sub.size()} == {len(mine)}", sub.size() == len(mine))
    _collectives(c, "split", dev, sub, mine)
    _collectives(c, "parent after split", dev, None, list(range(world)))
    # a split that leaves this rank out returns None
    only0 = dist.split_group(split_ranks=[[0]])
    c.true("non-member gets None", (only0 is None) == (rank != 0))
    # new_group beside a bound default group (torch asks non-members for an
    # NCCL-only step; rustccl's wrapper skips it)
    g = dist.new_group([0, 1])
    if rank in (0, 1):
        _collectives(c, "new_group", dev, g, [0, 1])
    # sparse CUDA all_reduce (allreduce_sparse)
    idx = torch.tensor([[rank, 0], [1, rank]], device=dev)
    sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0], device=dev), (world, world))
    dist.all_reduce(sp)
    want = sum(torch.sparse_coo_tensor(torch.tensor([[r, 0], [1, r]]), torch.tensor([1.0, 2.0]), (world, world)).to_dense()
               for r in range(world))
    c.eq("cuda sparse all_reduce", sp.to_dense().cpu(), want)
    dist.destroy_process_group()
    return c.count, c.failures


def shrink(rank: int, world: int) -> tuple[int, list[str]] | None:
    """The last rank dies; the survivors shrink on CUDA and go on."""
    dev = _init(rank, world)
    c = Checker(rank)
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    # A CUDA collective with a dead peer fails only at the group timeout
    # (the kernels wait on the GPU); the survivors learn of the death some
    # other way (here: they know) and shrink at once.
    time.sleep(0.5)
    t0 = time.monotonic()
    import torch.distributed.distributed_c10d as c10d
    new = dist.shrink_group([world - 1], shrink_flags=c10d.SHRINK_ABORT)
    y = torch.full((5,), float(rank), device=dev)
    dist.all_reduce(y)
    torch.cuda.synchronize()
    s = time.monotonic() - t0
    print(f"rank {rank}: shrink + first all_reduce on CUDA took {s:.3f} s", flush=True)
    c.true("shrunk size", new.size() == world - 1 and dist.get_world_size() == world - 1)
    c.eq("all_reduce on the shrunk group", y.cpu(), torch.full((5,), float(sum(range(world - 1)))))
    dist.destroy_process_group()
    return c.count, c.failures
