"""``python -m rustccl.bench``: argument parsing and dispatch.

Under a launcher (``RANK`` and ``WORLD_SIZE`` set, e.g. ``torchrun
--nproc_per_node=N -m rustccl.bench ...``) this process is one rank. With no
launcher it spawns ``--world`` ranks on this host (multiprocessing "spawn",
MASTER_ADDR=127.0.0.1 and a free port, OMP_NUM_THREADS=1 unless set, as
torchrun does) and exits with the worst rank's status. If a rank crashes,
the others are stopped after a short grace period. Exit status: 0; 1 when
``--check`` found mismatches or a backend failed an op (outputs are still
written); 2 when a rank crashed.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import socket
import sys
import time

from . import metrics
from .load import ENV as LOAD_ENV
from .load import busy
from .ops import DTYPES

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """'8', '64K', '32M', '1GiB' -> bytes (binary units)."""
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    unit = t[len(num):]
    if not num or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 8, 64K, 32M, 1G)")
    return int(float(num) * _UNITS[unit])


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rustccl.bench",
        description="nccl-tests-style sweep of torch.distributed collectives: rustccl vs gloo (CPU) / nccl (CUDA).",
        epilog="Several hosts or your own launcher: torchrun --nproc_per_node=N -m rustccl.bench [options]. "
               "See benchmarks/README.md.")
    a = p.add_argument
    a("--backends", type=_csv, help="comma-separated; the first is compared with the others "
      "(default rustccl,gloo on cpu, rustccl,nccl on cuda)")
    a("--variant", action="append", default=[], metavar="NAME:SETTING=VALUE[,SETTING=VALUE...]",
      help="also time a rustccl group with these RUSTCCL_* settings (rustccl.Options), as backend rustccl:NAME, "
           "in the same alternation as the others (two settings A/B in one process); repeatable")
    a("--device", choices=["cpu", "cuda"], help="default: cuda if available, else cpu")
    a("--world", type=int, help="ranks to spawn on this host when not under torchrun (default 2)")
    a("--ops", type=_csv, default=list(metrics.OPS), help=f"comma-separated subset of {','.join(metrics.OPS)}")
    a("--dtype", default="float32", choices=sorted(DTYPES))
    a("--min-bytes", type=parse_size, default=8, help="smallest per-rank size (default 8)")
    a("--max-bytes", type=parse_size, help="largest per-rank size (default 32M on cpu, 1G on cuda)")
    a("--factor", type=int, default=4, help="size multiplier between points (default 4)")
    a("--iters", type=int, help="timed calls per point (default 20, on cpu 100 up to 64 KiB; on cpu fewer for "
      "huge sizes)")
    a("--warmup", type=int, default=5, help="untimed calls before them (default 5)")
    a("--method", choices=["ab", "blocks"], default="ab",
      help="ab (default): every backend's group alive in one process, timed alternately, median of --repeats "
           "rounds; blocks: one backend's group at a time, op by op")
    a("--repeats", type=int, help="timed loops (rounds) per point; the median is reported (default 3 with ab, "
      "1 with blocks)")
    a("--check", action="store_true", help="verify every op's result; mismatches make the exit status 1")
    a("--ddp", action="store_true", help="also time the seeds' toy DDP step per backend")
    a("--ddp-size", type=int, default=4000, help="SIZE of the toy model's Linear(SIZE, SIZE) layers (4000)")
    a("--ddp-batch", type=int, help="batch per rank (default 1000 on cuda, 64 on cpu)")
    a("--ddp-steps", type=int, help="timed DDP steps after 3 untimed ones (default 20 on cuda, 5 on cpu)")
    a("--ddp-threads", type=int, help="torch intra-op threads of each rank during the DDP step (default: as the "
      "rank runs, 1 when spawned); the cores' count models a CPU training job's compute")
    a("--load", type=int, default=0, help="busy processes per core beside the ranks for the whole run (default 0; "
      "rows report their rate beside each backend as load_rate); only when the bench spawns the ranks")
    a("--no-pp", dest="pp", action="store_false", help="skip the pipeline-parallel micro-benchmark")
    a("--pp-stages", type=int, default=4, help="pipeline stages (default 4, at most the world size)")
    a("--pp-micro", type=int, default=8, help="micro-batches per pipeline step (default 8)")
    a("--pp-bytes", type=parse_size, default=1 << 20, help="activation (and gradient) bytes per micro-batch (1M)")
    a("--pp-steps", type=int, default=10, help="timed pipeline steps per round (default 10)")
    a("--out", default="bench-results", help="output directory (default ./bench-results)")
    a("--machine", default=socket.gethostname().split(".")[0], help="machine label for the file name and records")
    a("--name", help="file stem (default DATE-MACHINE-DEVICE-Nrank)")
    a("--timeout", type=float, default=300.0, help="seconds before a stuck collective fails (default 300)")
    h = p.add_argument_group("two simulated hosts (root): network namespaces joined by a shaped veth pair")
    h.add_argument("--hosts", type=int, help="run the compression benchmark on this many hosts (only 2)")
    h.add_argument("--link", default="1gbit", help="link between the hosts: 1gbit, 10gbit, 25gbit or none (default 1gbit)")
    h.add_argument("--ranks-per-host", type=int, default=2)
    h.add_argument("--netns-prefix", default="rcbench", help="prefix of the namespaces' names (the pid follows)")
    h.add_argument("--hosts-args", default="", help="extra arguments for rustccl.bench.multihost_rank, e.g. "
                   "'--steps 100 --configs none,engine\\ int8'")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show the progress bar even when stderr is not a terminal")
    g.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def finish_config(cfg, world: int):
    """Fills the device-dependent defaults and validates; returns cfg."""
    import torch

    p = build_parser()
    if cfg.device is None:
        cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = cfg.device == "cuda"
    cfg.backends = cfg.backends or ["rustccl", "nccl" if cuda else "gloo"]
    cfg.max_bytes = cfg.max_bytes if cfg.max_bytes is not None else (1 << 30 if cuda else 32 << 20)
    cfg.ddp_batch = cfg.ddp_batch or (1000 if cuda else 64)
    cfg.ddp_steps = cfg.ddp_steps or (20 if cuda else 5)
    cfg.repeats = cfg.repeats if cfg.repeats is not None else (3 if cfg.method == "ab" else 1)
    if cfg.method == "blocks":
        cfg.pp = False  # the pipeline step runs only with the A/B method
    bad = [o for o in cfg.ops if o not in metrics.OPS]
    if bad:
        p.error(f"unknown ops {bad}; known: {','.join(metrics.OPS)}")
    if len(set(cfg.backends)) != len(cfg.backends) or not cfg.backends:
        p.error("--backends: give distinct backend names")
    cfg.variants = parse_variants(p, cfg)
    if (cfg.iters is not None and cfg.iters < 1) or cfg.warmup < 0 or cfg.repeats < 1:
        p.error("--iters and --repeats must be >= 1, --warmup >= 0")
    if world < 2:
        p.error("need at least 2 ranks")
    try:
        metrics.sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)
    except ValueError as e:
        p.error(str(e))
    cfg.name = cfg.name or f"{datetime.date.today().isoformat()}-{cfg.machine}-{cfg.device}-{world}rank"
    return cfg


def parse_variants(p: argparse.ArgumentParser, cfg) -> dict[str, dict[str, str]]:
    """{"rustccl:NAME": {setting: value}} from the --variant options; puts
    their backends right after rustccl in cfg.backends."""
    out: dict[str, dict[str, str]] = {}
    for text in cfg.variant:
        name, _, rest = text.partition(":")
        pairs = [kv.split("=", 1) for kv in _csv(rest)]
        if not name.strip() or not pairs or any(len(kv) != 2 or not kv[0].strip() for kv in pairs):
            p.error(f"--variant {text!r}: give NAME:SETTING=VALUE[,SETTING=VALUE...]")
        label = f"rustccl:{name.strip()}"
        if label in out:
            p.error(f"--variant: {name!r} given twice")
        out[label] = {k.strip(): v.strip() for k, v in pairs}
    if out:
        if cfg.backends[0] != "rustccl" or cfg.method != "ab":
            p.error("--variant needs rustccl first in --backends and the ab method")
        if any(b.startswith("rustccl:") for b in cfg.backends):
            p.error("--backends: rustccl:NAME backends come from --variant")
        cfg.backends = [cfg.backends[0], *out, *cfg.backends[1:]]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cfg, world: int) -> int:
    """Runs ``world`` ranks on this host; returns the worst exit status."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    port = free_port()
    from .runner import child_entry

    procs = [ctx.Process(target=child_entry, args=(r, world, port, cfg)) for r in range(world)]
    with busy(cfg.load) as spec:
        if spec:
            os.environ[LOAD_ENV] = spec
        try:
            return _run(procs)
        finally:
            os.environ.pop(LOAD_ENV, None)


def _run(procs: list) -> int:
    """Starts the ranks and waits for them; returns the worst exit status."""
    for proc in procs:
        proc.start()
    crashed_at = None
    try:
        while any(proc.is_alive() for proc in procs):
            time.sleep(0.1)
            if crashed_at is None and any(proc.exitcode not in (None, 0, 3) for proc in procs):
                crashed_at = time.monotonic()
            if crashed_at is not None and time.monotonic() - crashed_at > 10:
                for proc in procs:
                    if proc.is_alive():
                        proc.kill()
    except KeyboardInterrupt:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc in procs:
            proc.join(timeout=5)
    codes = [proc.exitcode for proc in procs]
    if any(c not in (0, 3) for c in codes):
        print(f"rustccl.bench: a rank failed (exit codes {codes})", file=sys.stderr)
        return 2
    return 1 if 3 in codes else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = build_parser().parse_args(argv)
    from .runner import command_line

    cfg.command = command_line(argv)
    if cfg.hosts:
        import shlex

        from .multihost import run

        if cfg.timeout == 300.0:
            cfg.timeout = 1800.0
        return run(cfg, shlex.split(cfg.hosts_args))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if cfg.world is not None and cfg.world != world:
            build_parser().error(f"--world {cfg.world} but the launcher started WORLD_SIZE={world}")
        if cfg.load:
            build_parser().error("--load starts the busy processes beside ranks the bench spawns itself: run it "
                                 "without a launcher, or start the load yourself and leave --load out")
        cfg = finish_config(cfg, world)
        from .runner import rank_main

        return rank_main(cfg)
    world = cfg.world if cfg.world is not None else 2
    cfg = finish_config(cfg, world)
    if cfg.device == "cuda":
        import torch

        if torch.cuda.device_count() < world:
            build_parser().error(f"--world {world} needs {world} GPUs, found {torch.cuda.device_count()}")
    return spawn(cfg, world)


if __name__ == "__main__":
    sys.exit(main())
