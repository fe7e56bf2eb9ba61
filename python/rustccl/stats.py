"""Per-collective counters of rustccl process groups.

    >>> rustccl.stats()                     # the default group
    {'group': '0', 'rank': 0, 'size': 2, 'transport': 'tcp', 'nccl': None,
     'thresholds': {'small_allreduce_bytes': 65536, ..., 'shm_one_round_max_bytes': ...},
     'ops': {'all_reduce': {'calls': 12, 'bytes': ..., 'avg_us': ..., 'busbw_GBps': ...,
                            'recent_avg_us': ..., 'algorithm': 'ring', 'algorithms': {'ring': 12},
                            'transport': 'tcp', ...}}}
    >>> rustccl.reset_stats()

Times of CUDA collectives are measured on the device only with
RUSTCCL_CUDA_TIMING=1 (calls and bytes are always counted).
"""

from __future__ import annotations

from . import _rustccl


def _group_name(group) -> str:
    if isinstance(group, str):
        return group
    import torch.distributed as dist

    if group is None:
        group = dist.distributed_c10d._get_default_group()
    name = getattr(group, "group_name", None)
    if not name:
        raise ValueError(f"rustccl: {group!r} is not a process group")
    return name


def stats(group=None) -> dict:
    """Counters of `group` (a ProcessGroup, a group name, or None for the
    default group): per collective calls, errors, bytes, total and recent
    time, algbw / busbw, the algorithm and transport used last, and the
    successful calls per algorithm (``algorithms``; for send and recv
    between ranks of one host, how each message crossed: ``shm_ring``,
    ``shm_staged`` (through the sender's staging area, or copied out of
    it before its receive came), ``shm_read`` (read from the sender's
    tensor), ``shm_split``; ``direct`` over TCP); and
    the algorithm thresholds in force (``thresholds``: the settings, or what
    was chosen from the host, e.g. the shared-memory one-round limit); the
    group's own settings (``settings``: what ``pg_options=rustccl.Options``
    set over the environment); and
    this process's shared tensors (``shared_tensors``: bytes in use, peak,
    freed but kept, tensors that did not fit; None unless
    ``RUSTCCL_SHM_TENSORS=1``); and how often this process's waiting
    threads moved off a CPU another local rank's polling thread shared
    (``thread_moves``, ``RUSTCCL_SHM_KEEP_APART``)."""
    return _rustccl._stats(_group_name(group))


def reset_stats(group=None) -> None:
    """Zeroes the counters of `group`, or of every rustccl group when None."""
    _rustccl._reset_stats(None if group is None else _group_name(group))


def flight_record(group=None, path: str | None = None) -> dict:
    """The last operations of `group` on this rank (the flight recorder):
    for each, its sequence number, op, bytes, dtype, peers, device, state
    (queued / running / done / failed), error, and queue / start / finish
    times. Written as JSON into the directory `path`, or into
    RUSTCCL_FLIGHT_RECORDER_DIR when that is set and `path` is None."""
    import json
    import os

    directory = path if path is not None else (os.environ.get("RUSTCCL_FLIGHT_RECORDER_DIR") or None)
    return json.loads(_rustccl._flight_record(_group_name(group), directory))
