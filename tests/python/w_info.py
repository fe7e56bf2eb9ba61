"""Rank bodies for test_packaging.py: rustccl.info() inside a job."""

from __future__ import annotations

import os

import rustccl


def groups(rank: int, world: int) -> dict:
    """This rank's view of its groups, and its own pid."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t)  # the group is up and working
    report = rustccl.info()
    return {"pid": os.getpid(), "groups": report["groups"], "settings": report["settings"], "config": rustccl.config()}


def cuda_groups(rank: int, world: int) -> dict:
    """After a small CUDA all_reduce: rustccl.info(), and the same facts as
    torch and the driver (through ctypes) report them."""
    import ctypes

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    t = torch.ones(1024, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    report = rustccl.info()
    n = torch.cuda.device_count()
    version = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
    ref = {
        "driver": f"{version.value // 1000}.{(version.value % 1000) // 10}",
        "names": [torch.cuda.get_device_name(i) for i in range(n)],
        "cc": ["{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(n)],
        "access": [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)],
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    return {"report": report, "ref": ref, "value": t[0].item()}
