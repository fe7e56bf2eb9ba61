"""Runs a function on N spawned ranks and collects what each returns.

    results = launch.run("w_collectives:matrix", world=3, init="env")

The function (given as "module:name", importable from tests/python) is
called as fn(rank, world, *args) after the process group is initialised;
its return value comes back per rank. An exception on any rank, or a rank
that does not report within `timeout`, fails the caller with every rank's
traceback.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import tempfile
import time
import traceback


def communicate_all(procs, timeout: float, what: str) -> list[str]:
    """Each process's output once all ended; if one does not end within
    `timeout` seconds, kills them all and fails naming `what`."""
    import pytest

    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{what} did not finish in {timeout:.0f} s:\n" + "\n".join(logs))
    return logs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn_path, rank, world, init, backend, port, initfile, env, q, args, pg_timeout):
    try:
        os.environ.update(env)
        hosts = int(env.get("RUSTCCL_TEST_HOSTS", "0"))
        if hosts:
            # simulated hosts of consecutive ranks (shared memory within,
            # TCP between)
            os.environ["RUSTCCL_HOST_ID"] = f"simhost{rank * hosts // world}"
        os.environ.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )
        from datetime import timedelta

        import torch.distributed as dist

        import rustccl

        mod, name = fn_path.split(":")
        fn = getattr(importlib.import_module(mod), name)
        kw = dict(timeout=timedelta(seconds=pg_timeout))
        if init == "env":
            dist.init_process_group(backend, **kw)
        elif init == "tcp":
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)
        elif init == "file":
            dist.init_process_group(backend, init_method=f"file://{initfile}", rank=rank, world_size=world, **kw)
        if hosts and init != "none":
            links = rustccl.stats()["links"]
            host = [p * hosts // world for p in range(world)]
            want = ["" if p == rank else "shm" if host[p] == host[rank] else "tcp" for p in range(world)]
            assert links == want, f"rank {rank}: links {links}, want {want} on {hosts} simulated hosts"
        result = fn(rank, world, *args)
        if init != "none" and dist.is_initialized():
            dist.destroy_process_group()
        q.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        q.put((rank, "error", traceback.format_exc()))


def run(fn_path, world, *args, init="env", backend="rustccl", timeout=180, env=None, pg_timeout=60, may_die=()):
    """`may_die`: ranks allowed to exit without reporting (their result is None)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    initfile = os.path.join(tempfile.mkdtemp(prefix="rustccl-init-"), "store")
    procs = [
        ctx.Process(
            target=_entry,
            args=(fn_path, r, world, init, backend, port, initfile, dict(env or {}), q, args, pg_timeout),
            daemon=True,
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results, errors = {}, {}
    may_die = set(may_die)
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world:
            for i, p in enumerate(procs):
                if i in may_die and i not in results and i not in errors and p.exitcode is not None and q.empty():
                    results[i] = None
            if len(results) + len(errors) >= world:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(results) - set(errors))
                raise AssertionError(
                    f"{fn_path}: ranks {missing} did not finish within {timeout}s"
                    + "".join(f"\n--- rank {r} failed:\n{e}" for r, e in sorted(errors.items()))
                )
            try:
                rank, status, payload = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and i not in results and i not in errors and i not in may_die]
                if dead:
                    # give the queue a moment: a crashed rank may still have reported
                    time.sleep(0.5)
                    if q.empty():
                        raise AssertionError(f"{fn_path}: ranks {dead} died (exit codes {[procs[i].exitcode for i in dead]})")
                continue
            (results if status == "ok" else errors)[rank] = payload
            if errors and status == "error":
                # give the others a few seconds to report their side too
                deadline = min(deadline, time.monotonic() + 15)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(f"--- rank {r} failed:\n{e}" for r, e in sorted(errors.items())))
    return [results.get(r) for r in range(world)]


def expect_ok(results) -> None:
    """Asserts that the rank bodies checked something and every check passed
    (`results`: per rank what its body returned, starting with the number of
    checks and the list of failures)."""
    failures = [f for r in results for f in r[1]]
    checked = sum(r[0] for r in results)
    assert checked > 0, "no checks ran"
    assert not failures, f"{len(failures)} of {checked} checks failed:\n" + "\n".join(failures[:40])


def streamed_blocks_env(wait_us: str) -> dict:
    """Settings under which all_to_all / gather / scatter blocks of many
    chunks stream through the senders' slots between processes: 2 threads
    a rank, 256 KiB slots, blocks up to 4 MiB through them while they fit
    (read from the sender above), 1 KiB small slots; a wait of `wait_us`
    for a chunk before the rank's own thread takes it over."""
    return dict(RUSTCCL_TRANSPORT="shm", RUSTCCL_SHM_THREADS="2", RUSTCCL_SHM_SEGMENT_BYTES="131072",
                RUSTCCL_SHM_SLOT_MIN_BYTES="0", RUSTCCL_SHM_SMALL_BYTES="1024", RUSTCCL_SHM_ATTACH_MIN_BYTES="1048576",
                RUSTCCL_SHM_BLOCK_READ_MIN_BYTES="4194304", RUSTCCL_SHM_BLOCK_WAIT_US=wait_us)
