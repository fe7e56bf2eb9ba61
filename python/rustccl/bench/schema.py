"""The one results schema: every timing row a rustccl benchmark writes
(``python -m rustccl.bench``, ``python -m rustccl.bench.mpi``) has these
fields, so that any two runs compare by the same keys (docs/performance.md,
"The results schema")."""

from __future__ import annotations

import os
import subprocess

from ..hostinfo import cpu_model, host_fingerprint, mem_gib  # noqa: F401 (the schema's host fields)

# field: meaning (docs/performance.md renders the same list)
FIELDS = {
    "op": "the collective (all_reduce, ..., send_recv) or step (ddp_toy_step, pp_step)",
    "bytes": "bytes per rank",
    "dtype": "element type",
    "world": "number of ranks",
    "backend": "rustccl, gloo, nccl, mpi (Open MPI), or rustccl:NAME for a settings variant",
    "peer": "the other systems timed in the same processes, alternately (comma-separated)",
    "load": "busy processes per core beside the ranks (0: a quiet host)",
    "mode": "eager, or graph (CUDA graph replay)",
    "us": "median time per call over the rounds (rank 0)",
    "us_min": "the fastest round's time per call",
    "us_max": "the slowest round's time per call",
    "host": "host fingerprint: a hash of CPU model, cores, memory and kernel",
    "commit": "the git commit of rustccl that ran (or its version)",
    "machine": "the host kind the run names (the results folder)",
}


def git_commit() -> str | None:
    """The checkout rustccl runs from, else the one the benchmark is run
    in (an installed rustccl has no .git of its own)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for where in (here, os.getcwd()):
        try:
            out = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.stdout.strip():
            return out.stdout.strip()
    return None


def stamp(rows: list[dict], *, backends: list[str], machine: str, commit: str | None, load: float = 0,
          mode: str = "eager") -> list[dict]:
    """The ``result`` rows of one run with the run's fields filled in
    (``peer``, ``load``, ``mode``, ``host``, ``commit``, ``machine``);
    other rows pass unchanged. A row's own ``load`` or ``mode`` wins."""
    host = host_fingerprint()
    out = []
    for r in rows:
        if r.get("kind") == "result":
            peer = ",".join(b for b in backends if b != r["backend"])
            r = {"peer": peer, "load": load, "mode": mode, **r, "host": host, "commit": commit or "unknown",
                 "machine": machine}
        out.append(r)
    return out


def missing(row: dict) -> list[str]:
    """The schema's fields a result row lacks."""
    return [f for f in FIELDS if f not in row]
