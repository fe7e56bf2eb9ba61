"""Pipeline-parallel micro-benchmark: point-to-point as a pipeline uses it.

``--pp-stages`` stages (default 4, at most the world size; ranks
0..S-1, the rest idle) pass ``--pp-micro`` micro-batches of activations
(``--pp-bytes`` each) forward, stage to stage, then the gradients back
(GPipe schedule, no compute: only the communication of a step is timed).
Each stage receives with ``recv`` and sends with ``isend``, waiting for its
sends at the end of the step, as a pipeline engine would. One row per
backend: ``ms`` per step (median of ``--repeats`` loops of ``--pp-steps``
steps, the backends' loops alternating: ``ab.run_steps``) and the bytes one
stage boundary carries per step.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from .sweep import slowest, step_spread


def step_fn(rank: int, stages: int, micro: int, count: int, device, group):
    if rank >= stages:
        return lambda: None
    act_in = torch.zeros(count, device=device)
    act_out = torch.ones(count, device=device)
    grad_in = torch.zeros(count, device=device)
    grad_out = torch.ones(count, device=device)
    prev, nxt = rank - 1, rank + 1

    def step():
        sends = []
        for _ in range(micro):
            if prev >= 0:
                dist.recv(act_in, prev, group=group)
            if nxt < stages:
                sends.append(dist.isend(act_out, nxt, group=group))
        for _ in range(micro):
            if nxt < stages:
                dist.recv(grad_in, nxt, group=group)
            if prev >= 0:
                sends.append(dist.isend(grad_out, prev, group=group))
        for w in sends:
            w.wait()
    return step


def prepare(cfg, rank: int, world: int, device, group):
    """(step, stages, count): one pipeline step of this rank in `group`,
    after 2 untimed ones."""
    stages = max(2, min(cfg.pp_stages, world))
    count = max(1, cfg.pp_bytes // 4)
    step = step_fn(rank, stages, cfg.pp_micro, count, device, group)
    for _ in range(2):
        step()
    return step, stages, count


def row(cfg, backend: str, world: int, device, group, stages: int, count: int, loops: list, method: str) -> dict:
    """The result row of one backend's timed loops (seconds, ``pp_steps``
    steps each)."""
    ms = statistics.median(loops) / cfg.pp_steps * 1e3
    return {"kind": "result", "backend": backend, "device": device.type, "world": world, "op": "pp_step",
            "dtype": "float32", "stages": stages, "micro": cfg.pp_micro, "bytes": count * 4,
            "boundary_bytes": 2 * cfg.pp_micro * count * 4, "steps": cfg.pp_steps, "repeats": len(loops),
            "method": method, "ms": ms, "ms_max": slowest(ms, device, group), **step_spread(loops, cfg.pp_steps)}
