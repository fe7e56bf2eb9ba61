"""Rank bodies for test_groups.py: monitored_barrier, sparse all_reduce
(against a local dense reference and against gloo), and shrink_group."""

from __future__ import annotations

import inspect

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import rustccl


def _error(fn) -> dict | None:
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return {"type": type(e).__name__, "msg": str(e), "s": time.monotonic() - t0}
    return None


def _ones_sum(group=None) -> float:
    x = torch.ones(4)
    dist.all_reduce(x, group=group)
    return x[0].item()


# ------------------------------------------------------------ monitored barrier

def monitored(rank: int, world: int) -> dict:
    """3 ranks: a full barrier; then rank 2 stays away (rank 0 names it, rank 1
    learns it); then ranks 1 and 2 stay away with wait_all_ranks; then a
    subgroup [1, 2] whose rank 0 is global rank 1; the group works after each."""
    out = {"ok": _error(lambda: rustccl.monitored_barrier(timeout=timedelta(seconds=20)))}
    # through c10d directly (ProcessGroup.monitored_barrier)
    out["c10d"] = _error(lambda: dist.group.WORLD.monitored_barrier(timedelta(seconds=20)))
    # torch's own function: releases up to 2.14 refuse non-gloo groups by
    # name; later ones call the group's CPU backend, rustccl's barrier.
    # (Here, while every rank has called every barrier: a rank's control
    # messages are numbered per call, so after one that some rank skipped,
    # the group's next monitored barrier does not match up.)
    out["torch_calls_backend"] = "CPU-capable backend" in inspect.getsource(dist.monitored_barrier)
    out["torch"] = _error(lambda: dist.monitored_barrier(timeout=timedelta(seconds=20)))
    if rank != 2:
        out["missing"] = _error(lambda: rustccl.monitored_barrier(timeout=1.0))
    out["after_missing"] = _ones_sum()
    if rank == 0:
        out["all"] = _error(lambda: rustccl.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=True))
    out["after_all"] = _ones_sum()
    if rank == 0:  # rank 0's own time is spent before it looks at anyone
        out["zero"] = _error(lambda: rustccl.monitored_barrier(timeout=timedelta(seconds=0)))
    out["after_zero"] = _ones_sum()
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        out["sub_ok"] = _error(lambda: rustccl.monitored_barrier(sub, timeout=timedelta(seconds=20)))
        if rank == 1:
            out["sub_missing"] = _error(lambda: rustccl.monitored_barrier(sub, timeout=timedelta(seconds=1)))
        out["sub_after"] = _ones_sum(sub)
    out["end"] = _ones_sum()  # rank 0 (the store's host) leaves last
    return out


# ------------------------------------------------------------ sparse all_reduce

def _sparse_input(rank: int, dense_dims: tuple[int, ...]) -> torch.Tensor:
    """Rank r's COO tensor of shape (10, 6) + dense_dims: an uncoalesced
    tensor (repeated indices) with a rank-dependent number of entries; rank 1
    has none."""
    g = torch.Generator().manual_seed(100 + rank)
    nnz = 0 if rank == 1 else 3 + 4 * rank
    idx = torch.stack([torch.randint(0, 10, (nnz,), generator=g), torch.randint(0, 6, (nnz,), generator=g)])
    vals = torch.randint(-8, 9, (nnz, *dense_dims), generator=g).float()
    return torch.sparse_coo_tensor(idx, vals, (10, 6, *dense_dims))


def sparse(rank: int, world: int) -> dict:
    gloo = dist.new_group(backend="gloo")
    out = {}
    for dense_dims in [(), (3,)]:
        expect = sum(_sparse_input(r, dense_dims).to_dense() for r in range(world))
        x = _sparse_input(rank, dense_dims)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        fut = work.get_future().value()[0]
        y = _sparse_input(rank, dense_dims)
        dist.all_reduce(y, group=gloo)
        key = "x".join(map(str, dense_dims)) or "2d"
        out[key] = {
            "equal_dense": torch.equal(x.to_dense(), expect),
            "future_equal": torch.equal(fut.to_dense(), expect),
            "coalesced": fut.is_coalesced(),
            "is_sparse": x.is_sparse,
            "same_as_gloo": torch.equal(x.to_dense(), y.to_dense()),
        }
    out["avg_refused"] = _error(lambda: dist.all_reduce(_sparse_input(rank, ()), op=dist.ReduceOp.AVG))
    out["after"] = _ones_sum()
    return out


def ddp_sparse(rank: int, world: int) -> dict:
    """The same model with a sparse embedding trained with DDP over rustccl
    and over gloo from the same weights on the same data."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(50, 8, sparse=True), torch.nn.Flatten(), torch.nn.Linear(32, 1))

    results = {}
    for name, group in [("rustccl", None), ("gloo", gloo)]:
        m = model()
        ddp = DDP(m, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1000 + rank)
        for _ in range(5):
            ids = torch.randint(0, 50, (16, 4), generator=g)
            target = torch.randn(16, 1, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(ids), target).backward()
            opt.step()
        results[name] = [p.detach().clone() for p in m.parameters()]
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(results["rustccl"], results["gloo"]))}


# ------------------------------------------------------------ shrink_group

def shrink_dead(rank: int, world: int, victim: int, abort: bool) -> dict | None:
    """`victim` dies (SIGKILL) after one all_reduce; the survivors see the
    error, shrink the default group and keep working on the new one."""
    x = torch.ones(1 << 12)
    dist.all_reduce(x)
    threads_before = len(os.listdir("/proc/self/task"))
    shm_before = set(os.listdir("/dev/shm"))
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    first = _error(lambda: dist.all_reduce(torch.ones(1 << 12)))
    seen = rustccl.failed_ranks()
    t0 = time.monotonic()
    flags = c10d.SHRINK_ABORT if abort else c10d.SHRINK_DEFAULT
    new = dist.shrink_group(seen, shrink_flags=flags)
    shrink_s = time.monotonic() - t0
    y = torch.full((5,), float(rank))
    dist.all_reduce(y)  # the default group is the shrunk one now
    z = torch.zeros(5)
    if dist.get_rank() == 0:
        z += 7
    dist.broadcast(z, 0)
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    threads_after = len(os.listdir("/proc/self/task"))  # the parent's engine threads are gone
    return {
        "threads": (threads_before, threads_after),
        "shm_left": [f for f in set(os.listdir("/dev/shm")) - shm_before if f.startswith("rustccl-")],
        "first": first, "shrink_s": shrink_s, "seen": seen, "stats_ok": "all_reduce" in rustccl.stats()["ops"], "new_rank": new.rank(), "new_size": new.size(),
        "default_size": dist.get_world_size(), "default_rank": dist.get_rank(), "is_default": new == dist.group.WORLD,
        "sum": y.tolist(), "bcast": z.tolist(), "gathered": [t.item() for t in gathered],
        "backend": dist.get_backend(),
    }


def shrink_mismatch(rank: int, world: int) -> dict:
    """4 live ranks: 0 and 1 exclude [3], 2 excludes [1, 3], 3 stays out: every
    caller gets an error within the group timeout; nothing hangs."""
    x = torch.ones(8)
    dist.all_reduce(x)
    if rank == 3:
        time.sleep(8)
        return {"skipped": True}
    lst = [1, 3] if rank == 2 else [3]
    return {"err": _error(lambda: dist.shrink_group(lst))}


def shrink_subgroup(rank: int, world: int) -> dict:
    """Shrinking a non-default group leaves the default group as it is; the
    shrunk group keeps the group's own settings."""
    sub = dist.new_group([0, 1, 2], pg_options=rustccl.Options(RUSTCCL_SEGMENT_BYTES="8K"))
    out = {}
    if rank in (0, 1, 2):
        if rank != 2:
            new = dist.shrink_group([2], group=sub)
            t = torch.ones(3)
            dist.all_reduce(t, group=new)
            out.update(new_size=new.size(), sub_sum=t[0].item(), world_still=dist.get_world_size(),
                       settings=rustccl.stats(new)["settings"], segment=rustccl.stats(new)["thresholds"]["segment_bytes"])
    out["world_sum"] = _ones_sum()
    return out


# ------------------------------------------------------------ a group's own settings

def group_settings(rank: int, world: int) -> dict:
    """Groups with their own settings (pg_options=rustccl.Options) beside the
    default group: their results, the settings in force (stats), and bad
    settings refused with the group and the default group working after."""
    n = 10000
    want = torch.arange(n, dtype=torch.float32) * sum(range(1, world + 1))
    own = {"RUSTCCL_TRANSPORT": "tcp", "RUSTCCL_SMALL_ALLREDUCE_BYTES": "1K", "RUSTCCL_SEGMENT_BYTES": 4096}
    tcp = dist.new_group(backend="rustccl", pg_options=rustccl.Options(own))
    out = {}
    for name, g in (("tcp", tcp), ("default", None)):
        x = torch.arange(n, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(x, group=g)
        s = rustccl.stats(g)
        out[name] = {"equal": torch.equal(x, want), "links": s["links"], "settings": s["settings"],
                     "small": s["thresholds"]["small_allreduce_bytes"], "segment": s["thresholds"]["segment_bytes"],
                     "algorithms": sorted(s["ops"]["all_reduce"]["algorithms"]),
                     "slot": s["thresholds"].get("shm_slot_bytes")}
    slot = dist.new_group(backend="rustccl", pg_options=rustccl.Options(RUSTCCL_SHM_SLOT_MIN_BYTES="3M"))
    out["slot"] = rustccl.stats(slot)["thresholds"]["shm_slot_bytes"]
    values = {name: {k: v["value"] for k, v in rustccl.config(g).items()} for name, g in
              (("process", None), ("tcp", tcp), ("slot", slot), ("default", dist.group.WORLD))}
    out["config"] = {name: {k: v[k] for k in ("RUSTCCL_TRANSPORT", "RUSTCCL_SEGMENT_BYTES",
                                              "RUSTCCL_SHM_SLOT_MIN_BYTES", "RUSTCCL_FLIGHT_RECORDER_SIZE")}
                     for name, v in values.items()}
    out["config_keys_equal"] = len({tuple(v) for v in values.values()}) == 1
    bad = {
        "unknown": rustccl.Options(RUSTCCL_SHM_SLOT_MIN="1M"),
        "process": rustccl.Options(RUSTCCL_FLIGHT_RECORDER_SIZE=10),
        "value": rustccl.Options(RUSTCCL_SHM_SLOT_MIN_BYTES="lots"),
        "type": {"RUSTCCL_CHECK": "1"},
    }
    out["errors"] = {k: _error(lambda o=o: dist.new_group(backend="rustccl", pg_options=o)) for k, o in bad.items()}
    out["split"] = _error(lambda: dist.split_group(split_ranks=[list(range(world))],
                                                   pg_options=rustccl.Options(RUSTCCL_CHECK=1)))
    out["after"], out["tcp_after"] = _ones_sum(), _ones_sum(tcp)
    return out


def settings_differ(rank: int, world: int) -> dict:
    """Ranks that create one group with different settings: a setting that
    chooses a path (the broadcast threshold) warns on every rank, one a rank
    applies to its own threads alone (how long they spin) does not, and
    both groups still add up where their paths agree."""
    import warnings

    out = {}
    groups = {}
    for name, own in (("differ", {"RUSTCCL_SMALL_BROADCAST_BYTES": f"{rank + 1}K"}),
                      ("local", {"RUSTCCL_SHM_SPIN_US": str(rank)})):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            groups[name] = dist.new_group(backend="rustccl", pg_options=rustccl.Options(own))
        out[name] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    out["sums"] = [_ones_sum(groups["differ"]), _ones_sum(groups["local"])]
    return out
