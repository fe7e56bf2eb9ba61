"""Rank side of test_tune.py: a group picks up the tuned table."""

import os

import torch
import torch.distributed as dist

import rustccl

NAMES = ("RUSTCCL_SHM_SMALL_BYTES", "RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES", "RUSTCCL_SHM_ATTACH_MIN_BYTES",
         "RUSTCCL_SHM_ALL_GATHER_ATTACH_MIN_BYTES")


def settings_in_force(rank, world, dirs, env):
    """Each rank reads its own table directory (`dirs[rank]`); returns the
    values in force in the default group and in a new group, and checks a
    broadcast, an all_reduce and an all_gather under them against a local
    reference."""
    os.environ["RUSTCCL_TUNE_DIR"] = dirs[rank]
    os.environ["RUSTCCL_TUNE"] = "cached"  # conftest turns it off for the other tests
    os.environ.update(env)
    dist.init_process_group("rustccl")
    sub = dist.new_group(list(range(world)))
    out = {}
    for tag, g in (("default", dist.group.WORLD), ("new_group", sub)):
        cfg = rustccl.config(g)
        out[tag] = {n: cfg[n]["value"] for n in NAMES}
        x = torch.arange(1 << 18, dtype=torch.float32) * (rank + 1)  # 1 MiB
        dist.broadcast(x, 0, group=g)
        assert torch.equal(x, torch.arange(1 << 18, dtype=torch.float32)), tag
        y = torch.full((4096,), float(rank + 1))
        dist.all_reduce(y, group=g)
        assert torch.equal(y, torch.full((4096,), float(world * (world + 1) // 2))), tag
        z = torch.arange(1 << 18, dtype=torch.float32) + rank  # 1 MiB a rank
        zs = torch.empty(world << 18)
        dist.all_gather_into_tensor(zs, z, group=g)
        want = torch.cat([torch.arange(1 << 18, dtype=torch.float32) + r for r in range(world)])
        assert torch.equal(zs, want), tag
    return out
