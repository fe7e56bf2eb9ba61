"""The A/B method (the default): every backend's group alive in one process,
timed alternately, median of rounds.

The default process group is the first backend (rustccl); every other
backend gets a ``new_group`` over the same ranks, and so does each
``--variant`` (backend ``rustccl:NAME``: a rustccl group with its own
settings, ``pg_options=rustccl.Options(...)``), so two settings are timed
against each other as rustccl is against gloo. For every (op, size) each
backend runs its warm-ups, then ``--repeats`` rounds (default 3; at least 5 on CUDA) in which
every backend runs one timed loop of ``iters`` calls, the order of the
backends alternating from round to round; each backend's time is the
median of its rounds. Drift of a shared host (other load, thermals) hits
both backends alike, so the ratio of the two is what a single run can be
trusted for (as ``/work/shared/anchors/ab_bench.py``). The DDP toy step
and the pipeline step alternate the same way, a loop of steps a round
(``run_steps``). A backend that
fails an op gets an error row and is left out of the rest of the sweep (its
group may be broken); the others go on.

On CPU, points up to ``metrics.SMALL_BYTES`` also time the same call on a
group of torch's fake backend (which returns at once without moving a
byte), in the same alternation: torch's own cost per call, the floor no
backend goes below (``kind: floor`` rows; the reports show it beside the
backends and what the ratio would be for a backend that took no time).
Not for all_gather, which the fake backend runs as copies.

Each rustccl row also says which algorithms ran its timed calls on this
rank (``algorithms``: calls per algorithm, from ``rustccl.stats()``; for
send_recv, how the messages crossed), so a table shows where a threshold
switched paths.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

from . import membw, metrics, ops, pipeline
from .load import Counters
from .sweep import ddp_row, ddp_step, slowest, time_loop

# The busy processes of --load (inactive without).
LOAD = Counters()


def _error_row(backend: str, op: str, device, world: int, dtype: str, e: Exception) -> dict:
    msg = f"{backend} {op}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return {"kind": "error", "backend": backend, "device": device.type, "world": world, "op": op, "dtype": dtype,
            "error": msg}


def groups(cfg, store, rank: int, world: int, device, errors: list) -> dict:
    """{backend: group} for the backends that could start (default group:
    the first)."""
    args = dict(backend=cfg.backends[0], store=PrefixStore("rustccl-bench/ab", store), rank=rank,
                world_size=world, timeout=timedelta(seconds=cfg.timeout))
    if device.type == "cuda":
        args["device_id"] = device
    dist.init_process_group(**args)
    out = {cfg.backends[0]: dist.group.WORLD}
    for b in cfg.backends[1:]:
        try:
            if b in cfg.variants:
                import rustccl

                out[b] = dist.new_group(backend="rustccl", timeout=timedelta(seconds=cfg.timeout),
                                        pg_options=rustccl.Options(cfg.variants[b]))
                continue
            out[b] = dist.new_group(backend=b, timeout=timedelta(seconds=cfg.timeout))
        except Exception as e:  # noqa: BLE001 - the other backends are still measured
            errors.append((b, e))
    return out


def is_rustccl(backend: str) -> bool:
    """Whether a backend name is a rustccl group: the default one or a
    ``--variant`` (``rustccl:NAME``)."""
    return backend == "rustccl" or backend.startswith("rustccl:")


def thresholds(live: dict) -> dict:
    """{backend: rustccl.stats(group)["thresholds"]} for each rustccl group
    (this rank's): what the host chose where the settings left it, recorded
    in the header."""
    import rustccl

    out = {}
    for b, g in live.items():
        if is_rustccl(b):
            try:
                out[b] = rustccl.stats(g)["thresholds"]
            except Exception:  # noqa: BLE001 - information only
                pass
    return out


# The stats ops a bench op's calls count under (send_recv: both ways).
STATS_OPS = {"send_recv": ("send", "recv")}


def algorithms(group, op: str) -> dict:
    """rustccl's successful calls per algorithm so far for bench op `op`
    in `group` (this rank's counters; empty where the group is gone: the
    column is information, never a reason to stop the sweep)."""
    import rustccl

    try:
        stats = rustccl.stats(group)["ops"]
    except Exception:  # noqa: BLE001
        return {}
    out: dict = {}
    for name in STATS_OPS.get(op, (op,)):
        for a, n in stats.get(name, {}).get("algorithms", {}).items():
            out[a] = out.get(a, 0) + n
    return out


FLOOR = "torch floor"
# The fake backend's all_gather copies the input into every output chunk:
# not a no-op, so no floor.
NO_FLOOR = ("all_gather",)


def floor_group(device):
    """A group of torch's fake backend over every rank (CPU runs), or None
    where this torch has none."""
    if device.type != "cpu":
        return None
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend

        return dist.new_group(backend="fake")
    except Exception:  # noqa: BLE001 - the floor is an extra, the sweep goes on without it
        return None


def _rounds(cfg, device) -> int:
    """Timed rounds per point: ``--repeats``, at least 5 on CUDA (GPU
    hosts drift more than CPU ones)."""
    return max(cfg.repeats, 5) if device.type == "cuda" else cfg.repeats


def _alternate(fns: dict, groups_: dict, loops: dict, iters: int, rounds: int, device, rates: dict | None = None) -> dict:
    """``rounds`` rounds in which every name in ``groups_`` times one loop
    of ``iters`` calls of its ``fns`` entry (appended to ``loops``), the
    order alternating from round to round. Under ``--load``, ``rates``
    gets each loop's busy-process iterations per second. A name whose loop
    raises leaves ``groups_``; returns {name: exception} for those."""
    order, failed = list(fns), {}
    for k in range(rounds):
        for b in (order if k % 2 == 0 else order[::-1]):
            if b not in groups_:
                continue
            try:
                c0, t0 = LOAD.count(), time.perf_counter()
                loops[b].append(time_loop(fns[b], iters, 0, device, groups_[b]))
                if rates is not None and LOAD.active:
                    rates.setdefault(b, []).append((LOAD.count() - c0) / (time.perf_counter() - t0))
            except Exception as e:  # noqa: BLE001
                del groups_[b]
                failed[b] = e
    return failed


def _load_rate(rates: dict, b: str) -> dict:
    """The ``load_rate`` field of a row: the busy processes' median rate
    while ``b`` ran (nothing without ``--load``)."""
    return {"load_rate": statistics.median(rates[b])} if rates.get(b) else {}


def run_point(cfg, op: str, size: int, live: dict, rank: int, world: int, device, rows: list, errors: list,
              mismatches: list, floor=None) -> None:
    dtype = ops.DTYPES[cfg.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = metrics.element_count(size, itemsize, world)
    nbytes = metrics.reported_bytes(op, count, itemsize, world)
    iters, warmup = metrics.effective_iters(device.type, nbytes, cfg.iters, cfg.warmup)
    fns, loops = {}, {}
    for b, g in list(live.items()):
        try:
            if cfg.check:
                mismatches += [f"{b}: {m}" for m in ops.check(op, count, dtype, device, rank, world, g)]
            fns[b] = ops.timed_call(op, count, dtype, device, rank, world, g)
            for _ in range(warmup):
                fns[b]()
            loops[b] = []
        except Exception as e:  # noqa: BLE001
            errors.append((b, e, op))
            del live[b]
    # The floor joins the alternation as one more group (never a backend
    # row, never in `live`: a failure there drops only the floor).
    groups_ = dict(live)
    if floor is not None and nbytes <= metrics.SMALL_BYTES and op not in NO_FLOOR:
        try:
            fns[FLOOR] = ops.timed_call(op, count, dtype, device, rank, world, floor)
            for _ in range(warmup):
                fns[FLOOR]()
            loops[FLOOR], groups_[FLOOR] = [], floor
        except Exception:  # noqa: BLE001
            fns.pop(FLOOR, None)
    order = list(fns)
    counted = [b for b in groups_ if is_rustccl(b)]
    before = {b: algorithms(groups_[b], op) for b in counted}
    rounds = _rounds(cfg, device)
    rates: dict = {}
    for b, e in _alternate(fns, groups_, loops, iters, rounds, device, rates).items():
        if b != FLOOR:
            errors.append((b, e, op))
            del live[b]
    ran = {}
    for b in counted:
        if b in groups_:
            was = before[b]
            ran[b] = {a: n - was.get(a, 0) for a, n in algorithms(groups_[b], op).items() if n > was.get(a, 0)}
    for b in order:
        if b not in groups_ or not loops[b]:
            continue
        secs = statistics.median(loops[b]) / iters / ops.messages_per_iter(op)
        if b == FLOOR:
            rows.append({"kind": "floor", "device": device.type, "world": world, "op": op, "dtype": cfg.dtype,
                         "size": size, "bytes": nbytes, "us": secs * 1e6, "iters": iters, "repeats": rounds})
            continue
        algbw, busbw = metrics.bandwidths(op, nbytes, secs, world)
        per_round = [t / iters / ops.messages_per_iter(op) * 1e6 for t in loops[b]]
        rows.append({"kind": "result", "backend": b, "device": device.type, "world": world, "op": op,
                     "dtype": cfg.dtype, "size": size, "bytes": nbytes, "count": count, "us": secs * 1e6,
                     "us_min": min(per_round), "us_max": max(per_round), "us_rounds": per_round,
                     "us_slowest_rank": slowest(secs, device, live[b]) * 1e6, "algbw_GBps": algbw, "busbw_GBps": busbw,
                     "iters": iters, "warmup": warmup, "repeats": rounds, "method": "ab",
                     **({"algorithms": ran[b]} if b in ran else {}), **_load_rate(rates, b)})


def run_steps(cfg, op: str, live: dict, rank: int, world: int, device, rows: list, errors: list) -> None:
    """The DDP toy step or the pipeline step (``op``) of every backend in
    ``live``, as ``run_point`` times a call: each backend's step is built
    and warmed, then ``--repeats`` rounds in which every backend times one
    loop of steps, the order alternating from round to round; one row per
    backend (median of its rounds). A backend that fails gets an error in
    ``errors`` and leaves ``live``."""
    threads = torch.get_num_threads()
    if op == "ddp_toy_step" and cfg.ddp_threads:
        # intra-op threads filling the cores, as a CPU training job's
        torch.set_num_threads(cfg.ddp_threads)
    try:
        _run_steps(cfg, op, live, rank, world, device, rows, errors)
    finally:
        torch.set_num_threads(threads)


def _run_steps(cfg, op: str, live: dict, rank: int, world: int, device, rows: list, errors: list) -> None:
    steps, loops, meta = {}, {}, {}
    for b, g in list(live.items()):
        try:
            if op == "ddp_toy_step":
                steps[b] = ddp_step(cfg, rank, device, g)
            else:
                steps[b], stages, count = pipeline.prepare(cfg, rank, world, device, g)
                meta[b] = (stages, count)
            loops[b] = []
        except Exception as e:  # noqa: BLE001
            errors.append((b, e))
            del live[b]
    n = cfg.ddp_steps if op == "ddp_toy_step" else cfg.pp_steps
    rates: dict = {}
    errors += _alternate(steps, live, loops, n, _rounds(cfg, device), device, rates).items()
    for b in steps:
        if b not in live or not loops[b]:
            continue
        if op == "ddp_toy_step":
            rows.append(dict(ddp_row(cfg, b, world, device, live[b], loops[b], "ab"), **_load_rate(rates, b)))
        else:
            rows.append(dict(pipeline.row(cfg, b, world, device, live[b], *meta[b], loops[b], "ab"),
                             **_load_rate(rates, b)))


def run_all(cfg, store, rank: int, world: int, device, progress) -> tuple[list[dict], list[str], list[str]]:
    """The whole sweep (plus DDP and pipeline steps) by the A/B method;
    returns (rows, check mismatches, errors)."""
    rows, mismatches, raw = [], [], []
    live = groups(cfg, store, rank, world, device, raw)
    floor = floor_group(device)
    failed = {b: e for b, e in raw}
    rows.append({"kind": "thresholds", "thresholds": thresholds(live)})
    try:
        if device.type == "cpu":
            progress.update("copy bandwidth")
            rows.append({"kind": "copy", "copy_GBps": membw.measure(world), "host_copy": membw.measure_host(world)})
        for op in cfg.ops:
            for size in metrics.sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor):
                progress.update(f"{op} {metrics.human_bytes(size)}")
                errs = []
                run_point(cfg, op, size, live, rank, world, device, rows, errs, mismatches, floor)
                for b, e, o in errs:
                    failed[b] = e
                    rows.append(_error_row(b, o, device, world, cfg.dtype, e))
                progress.advance(len(cfg.backends))
        for b, e in raw:
            for op in cfg.ops:
                rows.append(_error_row(b, op, device, world, cfg.dtype, e))
        extra = (["ddp_toy_step"] if cfg.ddp else []) + (["pp_step"] if cfg.pp else [])
        for op in extra:
            progress.update(op)
            errs = []
            run_steps(cfg, op, live, rank, world, device, rows, errs)
            for b, e in errs:
                failed[b] = e
                rows.append(_error_row(b, op, device, world, cfg.dtype, e))
            progress.advance(len(cfg.backends))
    finally:
        dist.destroy_process_group()
    errors = [f"rank {rank}: {r['error']}" for r in rows if r.get("kind") == "error"]
    return rows, mismatches, errors
