"""One rank of a bench run (under torchrun, or spawned by ``__main__``).

The ranks meet once through ``torch.distributed.rendezvous("env://")``
(torchrun's agent store, or a TCPStore on rank 0 when self-spawned) and keep
that store for the whole run: every (op, backend) block creates its process
group on a prefix of it (see sweep). At the end each rank posts its check
mismatches and errors under ``rustccl-bench/final/<rank>``; rank 0 collects
them, writes ``<name>.jsonl``, ``<name>.md`` and ``<name>.png`` into
``--out`` and prints the table. Exit status: 0, or 1 when any rank saw a
mismatch or an error (outputs are written either way).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from . import ab, membw, metrics, plot, report, sweep
from .progress import Null, Progress
from .schema import cpu_model as _cpu_model
from .schema import git_commit as _git_commit
from .schema import mem_gib as _mem_gib


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _thread_moves() -> int:
    """How often this process's waiting threads moved off a CPU another
    local rank's polling thread shared (rustccl.stats()["thread_moves"])."""
    from rustccl import _rustccl

    return _rustccl._thread_moves()


def _huge_pages() -> dict:
    """Whether this run's large CPU tensors could sit on transparent huge
    pages: torch's own setting (THP_MEM_ALLOC_ENABLE, which madvises every
    CPU tensor of 2 MiB or more) and the host's mode. Reads through the
    kernel pin every page, so on the 2-core VM 8-32 MiB broadcasts and
    sends took 0.4-0.6x the time with it (`docs/decisions/0004`)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
        mode = text[text.index("[") + 1:text.index("]")]
    except (OSError, ValueError):
        mode = None
    return {"THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"), "host_mode": mode}


def header(cfg, world: int, device: torch.device, hosts: list[str], load_start, started) -> dict:
    """The JSONL header record: what ran where, with which software."""
    import rustccl

    cores = os.cpu_count()
    mem = _mem_gib()
    hardware = f"{_cpu_model()}, {cores} cores" + (f", {mem:g} GiB" if mem else "")
    h = {"kind": "header", "machine": cfg.machine, "host": socket.gethostname(), "hosts": sorted(set(hosts)),
         "date": started.isoformat(timespec="seconds"),
         "elapsed_s": round((datetime.datetime.now().astimezone() - started).total_seconds(), 1),
         "device": device.type, "world": world, "hardware": hardware, "cpu": _cpu_model(), "cores": cores,
         "mem_GiB": mem, "loadavg_start": load_start, "loadavg_end": _loadavg(),
         "torch_threads": torch.get_num_threads(), "huge_pages": _huge_pages(), "python": platform.python_version(),
         "platform": platform.platform(), "torch": torch.__version__, "rustccl": rustccl.__version__,
         "rustccl_git": _git_commit(),
         "rustccl_config": {k: v.get("value") for k, v in rustccl.config().items()},
         "command": cfg.command,
         "options": {k: getattr(cfg, k) for k in ("backends", "ops", "dtype", "min_bytes", "max_bytes", "factor",
                                                  "iters", "warmup", "repeats", "check", "ddp", "ddp_size", "ddp_batch",
                                                  "ddp_steps", "ddp_threads", "load", "timeout", "method", "pp",
                                                  "pp_stages", "pp_micro",
                                                  "pp_bytes", "pp_steps", "variants")}}
    if device.type == "cuda":
        h["gpu"] = torch.cuda.get_device_name(device)
        h["hardware"] += f"; {torch.cuda.device_count()}x {h['gpu']}"
        try:
            h["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - informational only
            pass
    return h


def free_stem(stem: str) -> str:
    """`stem`, or `stem-2`, `stem-3`, ...: the first whose files do not exist
    yet, so that an earlier run of the same name (same day, machine, device
    and ranks) is kept."""
    n = 1
    while any(os.path.exists(stem + (f"-{n}" if n > 1 else "") + ext) for ext in (".jsonl", ".md", ".png")):
        n += 1
    return stem + (f"-{n}" if n > 1 else "")


def write_outputs(cfg, head: dict, rows: list[dict], mismatches: list[str], errors: list[str]) -> dict:
    """Writes the three files (no PNG without matplotlib); returns their paths."""
    os.makedirs(cfg.out, exist_ok=True)
    stem = free_stem(os.path.join(cfg.out, cfg.name))
    ratio_rows = report.ratios(rows, cfg.backends)
    paths = {"jsonl": stem + ".jsonl", "md": stem + ".md", "png": stem + ".png"}
    report.write_jsonl(paths["jsonl"], head, rows, ratio_rows)
    text = report.markdown(head, rows, ratio_rows, mismatches, errors)
    with open(paths["md"], "w") as f:
        f.write(text)
    try:
        plot.plot(paths["png"], head, rows)
    except ImportError as e:  # matplotlib is optional: the table and JSONL are the results
        print(f"rustccl.bench: no plot ({e}); pip install matplotlib for the PNG", file=sys.stderr)
        del paths["png"]
    print(text, flush=True)
    print("wrote " + ", ".join(paths.values()), flush=True)
    return paths


def rank_main(cfg) -> int:
    import rustccl  # noqa: F401  (registers the "rustccl" backend)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cfg.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    load_start, started = _loadavg(), datetime.datetime.now().astimezone()
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=cfg.timeout)))

    n_points = len(metrics.sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor))
    total = len(cfg.backends) * (len(cfg.ops) * n_points + (1 if cfg.ddp else 0) + (1 if cfg.pp else 0))
    show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    progress = Progress(total, enabled=show) if rank == 0 else Null(total)

    run_all = ab.run_all if cfg.method == "ab" else sweep.run_all
    rows, mismatches, errors = run_all(cfg, store, rank, world, device, progress)
    copy_row = next((r for r in rows if r.get("kind") == "copy"), {})
    copy, host_copy = copy_row.get("copy_GBps"), copy_row.get("host_copy")
    chosen = next((r["thresholds"] for r in rows if r.get("kind") == "thresholds"), None)
    rows = [r for r in rows if r.get("kind") not in ("copy", "thresholds")]
    if copy:
        membw.annotate(rows, copy, socket.gethostname(), host_copy)
    progress.close()
    for e in errors:
        print(f"rustccl.bench: {e}", file=sys.stderr, flush=True)

    store.set(f"rustccl-bench/final/{rank}",
              json.dumps({"host": socket.gethostname(), "mismatches": mismatches, "errors": errors,
                          "thread_moves": _thread_moves()}))
    if rank != 0:
        return 1 if (mismatches or errors) else 0

    keys = [f"rustccl-bench/final/{r}" for r in range(world)]
    store.wait(keys, timedelta(seconds=cfg.timeout))
    finals = [json.loads(store.get(k)) for k in keys]
    all_mismatches = [m for f in finals for m in f["mismatches"]]
    all_errors = [e for f in finals for e in f["errors"]]
    head = header(cfg, world, device, [f["host"] for f in finals], load_start, started)
    head["method"] = cfg.method
    # per rank: times its waiting threads moved off a CPU another rank's shared
    head["thread_moves"] = [f.get("thread_moves") for f in finals]
    if chosen:
        # rank 0's thresholds per rustccl group: what the host chose
        head["rustccl_thresholds"] = chosen
    if copy:
        head["copy_GBps"] = copy
    if host_copy:
        head["host_copy"] = host_copy
    write_outputs(cfg, head, rows, all_mismatches, all_errors)
    if all_mismatches:
        print(f"rustccl.bench: --check found {len(all_mismatches)} mismatches", file=sys.stderr)
    if all_errors:
        print(f"rustccl.bench: {len(all_errors)} errors (see the table)", file=sys.stderr)
    return 1 if (all_mismatches or all_errors) else 0


def child_entry(rank: int, world: int, port: int, cfg) -> None:
    """Target of the self-spawned ranks (lives here, not in ``__main__``:
    multiprocessing cannot unpickle functions of a package's ``__main__``)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        code = rank_main(cfg)
    except BaseException:  # noqa: BLE001 - a crash is status 2 (3: finished, with mismatches or errors)
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(2)
    sys.stdout.flush()
    sys.exit(3 if code else 0)


def command_line(argv: list[str]) -> str:
    launcher = "torchrun ... -m rustccl.bench" if "TORCHELASTIC_RUN_ID" in os.environ else "python -m rustccl.bench"
    return (launcher + " " + shlex.join(argv)).strip()
