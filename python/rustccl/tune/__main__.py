"""``python -m rustccl.tune``: measures this host's table of shared-memory
settings for each ``--world`` (ranks on the host) and caches it, so that
every later group of that many ranks per host uses it (``RUSTCCL_TUNE``,
``rustccl.tune``). ``--out DIR`` also writes the check against the rules
as results (``tune-<world>rank.jsonl`` and ``.md``, in the results
schema: backend ``rustccl`` for the rules, ``rustccl:tuned`` for the
table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile

from . import cache_dir, host_key, table_path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rustccl.tune", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--world", default=None, help="ranks per host to tune for, comma-separated (default: 2, and the cores "
      "if more, up to 16)")
    a("--rounds", type=int, default=9, help="alternating rounds per cell (default 9)")
    a("--round-ms", type=float, default=5.0, help="target time of one candidate's round (default 5 ms)")
    a("--only", default=None, help="tune only these settings (comma-separated)")
    a("--dir", default=None, help=f"where the tables go (default RUSTCCL_TUNE_DIR or {cache_dir()})")
    a("--out", default=None, help="also write the check against the rules as results into this directory")
    a("--machine", default=socket.gethostname(), help="host kind named in the results (default: host name)")
    a("--rank", type=int, default=None, help=argparse.SUPPRESS)
    a("--store", default=None, help=argparse.SUPPRESS)
    return p


def _worlds(arg: str | None) -> list[int]:
    if arg:
        return [int(w) for w in arg.split(",") if w]
    cores = os.cpu_count() or 2
    return sorted({2, min(cores, 16)})


def _rank_main(args, world: int) -> int:
    from ..store import FileStore
    from .measure import tune_group

    log = (lambda s: print(f"  {s}", flush=True)) if args.rank == 0 else None
    only = args.only.split(",") if args.only else None
    tune_group(FileStore(args.store), args.rank, world, "tune", args.rounds, args.round_ms / 1e3, only, args.dir, log)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rank is not None:
        return _rank_main(args, int(args.world))
    env = dict(os.environ, OMP_NUM_THREADS="1", RUSTCCL_TUNE="off")
    for world in _worlds(args.world):
        print(f"rustccl.tune: {world} ranks on this host (host {host_key()})", flush=True)
        started = datetime.datetime.now().astimezone()
        with tempfile.TemporaryDirectory(prefix="rustccl-tune-") as where:
            base = [sys.executable, "-m", "rustccl.tune", "--world", str(world), "--store", where,
                    "--rounds", str(args.rounds), "--round-ms", str(args.round_ms)]
            base += ["--only", args.only] if args.only else []
            base += ["--dir", args.dir] if args.dir else []
            procs = [subprocess.Popen(base + ["--rank", str(r)], env=env) for r in range(world)]
            codes = [p.wait() for p in procs]
        if any(codes):
            print(f"rustccl.tune: a rank failed ({codes})", file=sys.stderr)
            return 1
        path = table_path(world, args.dir)
        with open(path) as f:
            table = json.load(f)
        print(f"rustccl.tune: {path} ({table.get('seconds')} s): {table['settings'] or 'the rules everywhere'}")
        if args.out:
            from .report import write

            print("rustccl.tune: wrote " + ", ".join(write(table, args.out, args.machine, started)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
