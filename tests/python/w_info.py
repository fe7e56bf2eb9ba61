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
