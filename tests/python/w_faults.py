"""Rank-side bodies of the fault tests: each returns what it observed
(error type, message, seconds until the error) for the parent to judge."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import rustccl


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return {"type": type(e).__name__, "msg": str(e), "s": time.monotonic() - t0,
                "runtime_error": isinstance(e, RuntimeError)}
    return {"type": None, "msg": "", "s": time.monotonic() - t0, "runtime_error": False}


def stalled(rank: int, world: int) -> dict:
    """RUSTCCL_FAULT delays rank 2's collective seq 1 beyond the timeout."""
    x = torch.ones(1000)
    dist.all_reduce(x)  # seq 0: fine
    first = _timed(lambda: dist.all_reduce(x))  # seq 1: rank 2 is late
    later = _timed(lambda: dist.all_reduce(x))  # fails fast with the same cause
    # Stay up (links open) until the other survivor reached its own deadline:
    # a rank whose seq 1 started a few ms later would otherwise see this
    # process exit ("connection closed by peer") before it times out.
    time.sleep(1.0)
    return {"first": first, "later": later}


def wait_timeout(rank: int, world: int) -> dict:
    """RUSTCCL_FAULT delays rank 1's first collective by 3 s; work.wait(0.5 s)
    gives up, the operation goes on and a later wait() sees it finish."""
    x = torch.full((8,), float(rank + 1))
    w = dist.all_reduce(x, async_op=True)
    short = _timed(lambda: w.wait(timeout=timedelta(milliseconds=500))) if rank == 0 else None
    w.wait()
    return {"short": short, "value": x.tolist()}


def killed(rank: int, world: int, how: str) -> dict | None:
    """Rank 2 dies before collective seq 1 (SIGKILL, or RUSTCCL_FAULT=kill),
    or its collective seq 1 panics (RUSTCCL_FAULT=panic) and it lives on."""
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    if rank == 2 and how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    first = _timed(lambda: dist.all_reduce(x))
    later = _timed(lambda: dist.all_reduce(x))
    if rank == 2 and how == "panic":
        # Alive well past the others' 10 s: they must fail on the closed
        # links, not on this process's exit.
        time.sleep(12)
    return {"first": first, "later": later}


def killed_mid_stream(rank: int, world: int) -> dict | None:
    """Rank 2 is killed (SIGKILL from a timer thread) while the ranks run
    back-to-back all_to_alls whose blocks stream through the senders'
    shared-memory slots, so it dies inside one: before, between or after
    its publish and its copies, or while its peers copy its chunks out.
    The others' call fails well before the group's timeout, naming the
    collective, and so do their later calls."""
    n = 40_000  # int32 elements a block: 160 KB, 10 chunks of 16 KiB
    ins = torch.arange(world * n, dtype=torch.int32) + rank * 1_000_003
    out = torch.full((world * n,), -1, dtype=torch.int32)
    dist.all_to_all_single(out, ins)
    ok = all(torch.equal(out[s * n:(s + 1) * n], torch.arange(rank * n, (rank + 1) * n, dtype=torch.int32) + s * 1_000_003)
             for s in range(world))
    algorithm = rustccl.stats()["ops"]["all_to_all"]["algorithm"]
    if rank == 2:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    calls, first, t0 = 0, None, time.monotonic()
    while first is None and time.monotonic() - t0 < 30:
        r = _timed(lambda: dist.all_to_all_single(out, ins))
        calls += 1
        if r["type"] is not None:
            first = r
    later = _timed(lambda: dist.all_to_all_single(out, ins))
    return {"ok": ok, "algorithm": algorithm, "calls": calls, "first": first, "later": later}


def mismatched(rank: int, world: int) -> dict:
    """Different sizes on different ranks; with RUSTCCL_CHECK=1 the group
    keeps working after the error."""
    bad = _timed(lambda: dist.all_reduce(torch.ones(10 + rank)))
    y = torch.ones(4)
    good = _timed(lambda: dist.all_reduce(y))
    return {"bad": bad, "good": good, "y": y.tolist()}


def flight(rank: int, world: int, directory: str) -> dict:
    """A timeout writes the flight recorder; flight_record() returns it."""
    x = torch.ones(16)
    for _ in range(5):
        dist.all_reduce(x, async_op=True).wait()
    dist.all_reduce(x)
    err = None
    if rank == 0:
        err = _timed(lambda: dist.all_reduce(x))  # rank 1 never calls it
    else:
        time.sleep(4)
    rec = rustccl.flight_record()
    files = sorted(f for f in os.listdir(directory) if f.startswith("rustccl-flight-"))
    return {"err": err, "record": rec, "files": files}


def abort(rank: int, world: int) -> dict:
    """pg.abort() makes a stuck collective fail at once."""
    x = torch.ones(16)
    dist.all_reduce(x)
    out = None
    if rank == 0:
        w = dist.all_reduce(x, async_op=True)  # rank 1 never joins
        time.sleep(0.5)
        t0 = time.monotonic()
        dist.distributed_c10d._get_default_group().abort()
        out = _timed(w.wait)
        out["since_abort"] = time.monotonic() - t0
    else:
        time.sleep(2)
    return {"out": out}


def cycles(rank: int, world: int, n: int) -> dict:
    """n init / destroy cycles in one process: threads, descriptors and
    memory must not grow."""
    port = int(os.environ["MASTER_PORT"])
    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=timedelta(seconds=60))

    def counts():
        tasks = os.listdir("/proc/self/task")
        names = []
        for t in tasks:
            try:
                with open(f"/proc/self/task/{t}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {"threads": len(tasks), "rustccl_threads": sum(n.startswith("rustccl") for n in names),
                "fds": len(os.listdir("/proc/self/fd")), "rss": rss}

    samples = []
    for k in range(n):
        dist.init_process_group("rustccl", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
        x = torch.full((1000,), float(k))
        dist.all_reduce(x)
        assert x[0].item() == k * world
        dist.destroy_process_group()
        if k in (n // 4, n - 1):
            samples.append(counts())
    return {"after_warmup": samples[0], "end": samples[1]}


def _gone(pid: int, within: float) -> bool:
    """Whether process `pid` exited (or is a zombie) within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.01)
    return False


SENT_THEN_LEFT = [1000, 1 << 18]  # floats: 4 KB by value, 1 MiB (staged or streamed)


def send_then_exit(rank: int, world: int) -> dict:
    """Rank 0 sends, destroys its group and exits; rank 1 posts its
    receives only once rank 0's process is gone. A send that completed is
    delivered (as gloo's, whose bytes wait in the socket)."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        for i, n in enumerate(SENT_THEN_LEFT):
            dist.send(torch.arange(n, dtype=torch.float32) + i, 1)
        store.set("sender_pid", str(os.getpid()))
        store.wait(["pid_read"])  # the store lives in this process
        staged = rustccl.stats()["thresholds"].get("shm_staged_send_max_bytes")
        dist.destroy_process_group()
        return {"staged_max": staged}
    pid = int(store.get("sender_pid"))
    store.set("pid_read", "1")
    gone = _gone(pid, 60)
    got = []
    for i, n in enumerate(SENT_THEN_LEFT):
        y = torch.zeros(n)
        err = _timed(lambda: dist.recv(y, 0))
        got.append({"err": err, "equal": torch.equal(y, torch.arange(n, dtype=torch.float32) + i)})
    return {"gone": gone, "got": got}


def _mismatch_cases(rank: int, world: int):
    """The cases of `_mismatch_cases_in`, each in a group of its own."""
    groups = []
    for name, case in _mismatch_cases_in(rank, world, lambda: groups[-1]):
        groups.append(dist.new_group(list(range(world))))
        yield name, case


def _mismatch_cases_in(rank: int, world: int, g):
    """(name, call) pairs: each call runs one collective (in group `g()`)
    in which the last
    rank passes tensors of another dtype (same byte length) or reduce op,
    and returns what this rank holds afterwards and what it should hold if
    the call succeeded here (computed from the agreeing ranks' inputs):
    None where it must fail, "any" where it only sends (its tensor then
    holds nothing of the others')."""
    odd = rank == world - 1
    dt = torch.int32 if odd else torch.float32

    def t(n, value):
        return torch.full((n,), value, dtype=dt)

    def all_reduce():
        x = t(8, 1)
        dist.all_reduce(x, group=g())
        return x, None  # no rank may finish

    def all_reduce_f64():
        x = torch.ones(4, dtype=torch.float64) if odd else torch.ones(8)
        dist.all_reduce(x, group=g())
        return x, None

    def all_reduce_op():
        x = torch.ones(8)
        dist.all_reduce(x, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM, group=g())
        return x, None

    def broadcast():
        x = t(8, 7 if rank == 0 else 0)
        dist.broadcast(x, 0, group=g())
        return x, torch.full((8,), 7.0)

    def reduce():
        x = t(8, 1)
        dist.reduce(x, 0, group=g())
        return x, None if rank == 0 else "any"

    def all_gather():
        out = torch.zeros(8 * world, dtype=dt)
        dist.all_gather_into_tensor(out, t(8, rank), group=g())
        return out, None

    def reduce_scatter():
        out = torch.zeros(8, dtype=dt)
        dist.reduce_scatter_tensor(out, t(8 * world, 1), group=g())
        return out, None

    def all_to_all():
        out = torch.zeros(8 * world, dtype=dt)
        dist.all_to_all_single(out, t(8 * world, rank), group=g())
        return out, None

    def gather():
        out = [torch.zeros(8, dtype=dt) for _ in range(world)] if rank == 0 else None
        dist.gather(t(8, rank), out, 0, group=g())
        return (torch.cat(out) if out else torch.zeros(0)), (None if rank == 0 else "any")

    def scatter():
        x = torch.zeros(8, dtype=dt)
        ins = [t(8, r) for r in range(world)] if rank == 0 else None
        dist.scatter(x, ins, 0, group=g())
        return x, torch.full((8,), float(rank))

    cases = [all_reduce, all_reduce_f64, all_reduce_op, broadcast, reduce, all_gather, reduce_scatter,
             all_to_all, gather, scatter]
    for case in cases:
        yield case.__name__, case


def tcp_mismatch(rank: int, world: int) -> dict:
    """Every collective with the last rank's dtype (or reduce op) differing
    from the others' at the same byte length, each in a group of its own
    (a mismatch poisons the group it happens in); and a send / recv pair
    of float32 against int32. What each rank saw comes back."""
    out = {}
    for name, case in _mismatch_cases(rank, world):
        held = {}

        def run():
            got, want = case()
            held["got"], held["want"] = got.tolist(), (want.tolist() if isinstance(want, torch.Tensor) else want)

        r = _timed(run)
        out[name] = dict(r, **held)
    g = dist.new_group(list(range(world)))
    if rank == 0:
        out["send_recv"] = _timed(lambda: dist.send(torch.ones(8), 1, group=g))
    elif rank == 1:
        buf = torch.zeros(8, dtype=torch.int32)
        out["send_recv"] = _timed(lambda: dist.recv(buf, 0, group=g))
        out["send_recv"]["got"] = buf.tolist()
    return out


def mismatch_then_go_on(rank: int, world: int) -> dict:
    """In one group: collectives in which the last rank passes another
    size, dtype or reduce op (small and large, so every algorithm of the
    transport meets it), each followed by a correct all_reduce. What each
    rank saw comes back."""
    odd = rank == world - 1
    sizes = {"40B": 10, "1MiB": 1 << 18, "16MiB": 1 << 22}

    def size_case(n):
        def run():
            x = torch.ones(n + (2 if odd else 0))
            dist.all_reduce(x)
            return x, None
        return run

    def dtype_case(n):
        def run():
            x = torch.ones(n, dtype=torch.int32 if odd else torch.float32)
            dist.all_reduce(x)
            return x, None
        return run

    def broadcast_case(n):
        def run():
            x = torch.full((n + (2 if odd else 0),), 7.0 if rank == 0 else 0.0)
            dist.broadcast(x, 0)
            return x, torch.full((n,), 7.0)
        return run

    cases = [(f"all_reduce_size_{k}", size_case(n)) for k, n in sizes.items()]
    cases += [(f"all_reduce_dtype_{k}", dtype_case(n)) for k, n in sizes.items()]
    cases += [(f"broadcast_size_{k}", broadcast_case(n)) for k, n in sizes.items()]
    cases += list(_mismatch_cases_in(rank, world, lambda: dist.group.WORLD))
    out = {}
    for name, case in cases:
        held = {}

        def run():
            got, want = case()
            held["want"] = want.tolist() if isinstance(want, torch.Tensor) else want
            held["got"] = got.tolist() if isinstance(want, torch.Tensor) else None

        r = _timed(run)
        y = torch.full((5,), float(rank + 1))
        after = _timed(lambda: dist.all_reduce(y))
        after["y"] = y.tolist()
        out[name] = dict(r, **held, after=after)
    return out
