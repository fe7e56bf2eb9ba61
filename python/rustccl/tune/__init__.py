"""Tuning measured on the user's host: which table of shared-memory
settings a group uses.

The engine's rules choose its shared-memory algorithms and thread counts
from the host's cores and caches (``docs/decisions/0006``); they were
fitted on a few hosts. ``python -m rustccl.tune`` times the candidates of
each rule on this host (``rustccl.tune.measure``) and caches the settings
that beat the rules as a table per host fingerprint (CPU model, cores,
NUMA nodes, memory, kernel) and number of ranks on the host. Every new
group then looks the table up (``RUSTCCL_TUNE``):

- ``cached`` (default): rank 0 reads the table for its host and the
  group's ranks per host, if there is one, and every rank of the group
  applies rank 0's: the tuned settings choose algorithms and layouts, so
  ranks that applied different tables would take different paths for one
  call. Without a table: the rules.
- ``run``: as ``cached``; where rank 0 has no table and the group's ranks
  all share its host, they measure one now (about a minute) and rank 0
  caches it. Never the default: a job or a test tunes only when asked.
- ``off``: the rules.

A setting the user gives (environment or ``rustccl.Options``) wins over
the table. The tables live in ``RUSTCCL_TUNE_DIR`` (default
``~/.cache/rustccl/tune``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings

from ..hostinfo import cpu_model, host_fingerprint, numa_nodes

MODES = ("off", "cached", "run")
# A setting the user gives also keeps the tuned values of the narrower
# settings it speaks for: a table's per-collective read threshold would
# otherwise win over the user's shared one.
COVERS = {"RUSTCCL_SHM_ATTACH_MIN_BYTES": tuple(f"RUSTCCL_SHM_{op}_ATTACH_MIN_BYTES" for op in
                                                ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "REDUCE"))}
TABLE_KIND = "rustccl.tune/1"


def mode() -> str:
    m = os.environ.get("RUSTCCL_TUNE", "cached").strip().lower() or "cached"
    if m not in MODES:
        warnings.warn(f"rustccl: RUSTCCL_TUNE={m!r} is not one of {', '.join(MODES)}; using the rules", RuntimeWarning,
                      stacklevel=3)
        return "off"
    return m


@functools.cache
def host_key() -> str:
    """The host fingerprint the tables are cached under: the results'
    fingerprint (CPU model, cores, memory, kernel) with the NUMA nodes."""
    return hashlib.sha256(f"{host_fingerprint()}|numa={numa_nodes()}".encode()).hexdigest()[:12]


def cache_dir() -> str:
    return os.environ.get("RUSTCCL_TUNE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "rustccl", "tune")


def table_path(local_ranks: int, where: str | None = None) -> str:
    return os.path.join(where or cache_dir(), f"{host_key()}-{local_ranks}rank.json")


def load(local_ranks: int, where: str | None = None) -> dict | None:
    """This host's table for `local_ranks` ranks per host, if cached (and
    readable, and of this host)."""
    try:
        with open(table_path(local_ranks, where)) as f:
            table = json.load(f)
    except (OSError, ValueError):
        return None
    if table.get("kind") != TABLE_KIND or table.get("host_key") != host_key():
        return None
    return table


def save(table: dict, where: str | None = None) -> str:
    path = table_path(table["local_ranks"], where)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1)
    os.replace(tmp, path)
    return path


def new_table(local_ranks: int, settings: dict[str, str], cells: list[dict]) -> dict:
    return {"kind": TABLE_KIND, "host_key": host_key(), "cpu_model": cpu_model(), "cores": os.cpu_count(),
            "numa_nodes": numa_nodes(), "local_ranks": local_ranks, "settings": settings, "cells": cells}


def _local_ranks(size: int) -> int:
    """Ranks on this host, as the launcher says (torchrun and Open MPI
    do), else every rank of the group."""
    for var in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        v = os.environ.get(var)
        if v and v.isdigit():
            return min(int(v), size)
    return size


def _store_key(group: str) -> str:
    return f"rustccl/tune/{group}"


def settings_for(store, rank: int, size: int, group: str,
                 settings: list[tuple[str, str]] | None) -> list[tuple[str, str]] | None:
    """The group's settings with the tuned table filled in: `settings`
    (the group's own, from ``rustccl.Options``) over rank 0's table, where
    neither they nor this process's environment set a name. Every rank of
    the group calls it before its rendezvous; rank 0 publishes its table's
    settings in `store`, the others read them there."""
    m = mode()
    if m == "off" or size < 2:
        return settings
    key = _store_key(group)
    if rank == 0:
        local = _local_ranks(size)
        table = load(local)
        measure = table is None and m == "run" and local == size
        raw = "measure" if measure else json.dumps(sorted((table or {}).get("settings", {}).items()))
        store.set(key, raw.encode())
    else:
        raw = bytes(store.get(key)).decode()
    if raw == "measure":
        # rank 0 has no table for this host and was asked to make one:
        # every rank of the group measures it with rank 0
        from .measure import tune_group

        pairs = sorted(tune_group(store, rank, size, group)["settings"].items())
    else:
        pairs = [(k, v) for k, v in json.loads(raw)]
    given = {k for k, _ in settings or []} | {k for k in os.environ if k.startswith("RUSTCCL_")}
    given |= {k for g in given for k in COVERS.get(g, ())}
    tuned = [(k, v) for k, v in pairs if k not in given]
    if not tuned:
        return settings
    return list(settings or []) + tuned
