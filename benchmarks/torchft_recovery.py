"""torchft over rustccl against torchft's own gloo group: same host, same run.

    python benchmarks/torchft_recovery.py --world 2 --rounds 5 --out benchmarks/results/devbox-2core/torchft

Two measurements, each alternating the two process groups round by round:

1. ``configure``: ``--world`` processes call what torchft's
   ``ProcessGroupWrapper.configure()`` does, timed in parts: the store
   connection (``create_store_client``, shared by both backends), the
   process group's creation, and its first collective (a 4-byte
   all-reduce). Median over ``--rounds``, with the spread.
2. ``recovery``: two replicas of ``examples/train_torchft.py`` (processes,
   a Lighthouse with a ``--heartbeat-ms`` heartbeat timeout) train; after a
   few steps together, replica 1 is SIGKILLed and restarted at once.
   Measured from replica 0's and the restarted replica's step logs: steps
   per second while both train, time from the death to replica 0's next
   committed step, and time from the restart to the restarted replica's
   first committed step (its Python start-up included, measured apart as
   ``python -c 'import torch, torchft'``).

Writes ``OUT.jsonl`` (one row per measurement) and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("rustccl", "gloo")
# configure() also over rustccl's TCP links, as between hosts
CONFIGURE = ("rustccl", "rustccl-tcp", "gloo")


def _pg(backend: str, timeout: timedelta):
    if backend.startswith("rustccl"):
        import rustccl
        from rustccl.torchft import ProcessGroupRustccl

        # rustccl-tcp: the links that ranks on different hosts use
        options = rustccl.Options(RUSTCCL_TRANSPORT="tcp") if backend == "rustccl-tcp" else None
        return ProcessGroupRustccl(timeout=timeout, options=options)
    from torchft.process_group import ProcessGroupGloo

    return ProcessGroupGloo(timeout=timeout)


def _configure_worker(rank: int, world: int, port: int, rounds: int, out: str) -> None:
    import torch
    from torch.distributed import AllreduceOptions
    from torchft.process_group import create_store_client

    timeout = timedelta(seconds=60)
    rows = []
    for i in range(rounds):
        order = CONFIGURE if i % 2 == 0 else CONFIGURE[::-1]
        for backend in order:
            pg = _pg(backend, timeout)
            t0 = time.perf_counter()
            store = create_store_client(f"localhost:{port}/configure/{i}/{backend}", timeout)
            t1 = time.perf_counter()
            store.set(f"probe/{rank}", b"x")
            store.get(f"probe/{rank}")
            rtt = time.perf_counter() - t1  # two store round trips: a floor for any rendezvous
            t1 = time.perf_counter()
            pg._pg = pg._create_pg(store, rank, world)
            t2 = time.perf_counter()
            pg.allreduce([torch.ones(1)], AllreduceOptions()).wait()
            t3 = time.perf_counter()
            pg.abort(errored=False)
            rows.append({"backend": backend, "round": i, "store_ms": (t1 - t0 - rtt) * 1e3, "store_rtt2_ms": rtt * 1e3,
                         "create_ms": (t2 - t1) * 1e3, "first_ms": (t3 - t2) * 1e3})
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def configure(world: int, rounds: int) -> list[dict]:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        mp.spawn(_configure_worker, args=(world, store.port, rounds, f.name), nprocs=world)
        rows = json.loads(Path(f.name).read_text())
    return [dict(r, measure="configure", world=world) for r in rows]


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class SurvivorCrashed(Exception):
    pass


def _until(cond, survivor: subprocess.Popen, limit: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if survivor.poll() is not None:
            raise SurvivorCrashed
        if time.monotonic() - t0 > limit:
            raise TimeoutError("a replica did not get there")
        time.sleep(0.01)


def recovery(backend: str, heartbeat_ms: int, step_ms: float, workdir: Path) -> dict:
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, quorum_tick_ms=20,
                                  heartbeat_timeout_ms=heartbeat_ms)
    env = dict(os.environ, TORCHFT_LIGHTHOUSE=lighthouse.address(), OMP_NUM_THREADS="1")
    logs = [workdir / f"{backend}-0.jsonl", workdir / f"{backend}-1.jsonl", workdir / f"{backend}-1b.jsonl"]
    for f in logs:
        f.unlink(missing_ok=True)

    def start(rid: int, log: Path) -> subprocess.Popen:
        cmd = [sys.executable, str(ROOT / "examples/train_torchft.py"), "--replica-id", str(rid), "--steps", "100000",
               "--step-ms", str(step_ms), "--backend", backend, "--log", str(log)]
        return subprocess.Popen(cmd, env=env, stdout=open(log.with_suffix(".out"), "wb"), stderr=subprocess.STDOUT)

    procs = [start(0, logs[0]), start(1, logs[1])]
    try:
        together = lambda: [r for r in _records(logs[0]) if r["participants"] == 2]  # noqa: E731
        _until(lambda: len(together()) >= 30, procs[0])
        steps = together()[5:]
        step_s = statistics.median(b["time"] - a["time"] for a, b in zip(steps, steps[1:]))
        procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        procs[1].wait()
        procs[1] = start(1, logs[2])
        restarted = time.time()
        # the survivor's first step without the dead replica (a step in
        # flight at the kill may still commit with both)
        alone = lambda: [r["time"] for r in _records(logs[0]) if r["time"] > killed and r["participants"] == 1]  # noqa: E731
        try:
            _until(lambda: alone(), procs[0])
            _until(lambda: len(_records(logs[2])) >= 3, procs[0])
            death_s, crashed = min(alone()) - killed, False
            rejoin_s = _records(logs[2])[0]["time"] - restarted
        except SurvivorCrashed:
            death_s, rejoin_s, crashed = None, None, True
    finally:
        for p in procs:
            p.kill()
            p.wait()
        lighthouse.shutdown()
    return {"measure": "recovery", "backend": backend, "heartbeat_ms": heartbeat_ms, "step_ms": step_ms,
            "steps_per_s": 1 / step_s, "death_to_step_s": death_s, "restart_to_step_s": rejoin_s,
            "survivor_crashed": crashed}


def python_start() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torchft, rustccl.torchft"], check=True)
    return time.perf_counter() - t0


def _med(rows: list[dict], key: str) -> str:
    v = sorted(r[key] for r in rows if r[key] is not None)
    if not v:
        return "-"
    return f"{statistics.median(v):.3g} ({v[0]:.3g}-{v[-1]:.3g})"


def report(rows: list[dict], machine: str, start_s: float) -> str:
    out = [f"# torchft on rustccl vs torchft's gloo group ({machine})", "",
           "`python benchmarks/torchft_recovery.py`: both process groups in the same run, alternating round by",
           "round; median (min-max) over the rounds.", ""]
    conf = [r for r in rows if r["measure"] == "configure"]
    if conf:
        world = conf[0]["world"]
        out += [f"## configure(), {world} ranks (ms)", "",
                "| backend | store connection | process group created | first all-reduce | group + first all-reduce "
                "| two store round trips |", "|---|---|---|---|---|---|"]
        for b in CONFIGURE:
            rs = [dict(r, total=r["create_ms"] + r["first_ms"]) for r in conf if r["backend"] == b]
            out.append(f"| {b} | {_med(rs, 'store_ms')} | {_med(rs, 'create_ms')} | {_med(rs, 'first_ms')} | "
                       f"{_med(rs, 'total')} | {_med(rs, 'store_rtt2_ms')} |")
        def total(b: str) -> float:
            return statistics.median(r["create_ms"] + r["first_ms"] for r in conf if r["backend"] == b)

        out += ["", f"Group creation plus first collective, gloo's time over rustccl's: {total('gloo') / total('rustccl'):.2f} "
                f"(shared memory), {total('gloo') / total('rustccl-tcp'):.2f} (TCP links).", ""]
    rec = [r for r in rows if r["measure"] == "recovery"]
    if rec:
        hb = rec[0]["heartbeat_ms"]
        out += [f"## A replica killed and restarted (2 replicas, heartbeat timeout {hb} ms)", "",
                "| backend | steps/s, both training | death -> survivor's next step (s) | "
                "restart -> its first step (s) | survivor crashed |", "|---|---|---|---|---|"]
        for b in BACKENDS:
            rs = [r for r in rec if r["backend"] == b]
            crashed = sum(r["survivor_crashed"] for r in rs)
            out.append(f"| {b} | {_med(rs, 'steps_per_s')} | {_med(rs, 'death_to_step_s')} | "
                       f"{_med(rs, 'restart_to_step_s')} | {crashed} of {len(rs)} |")
        out += ["", f"The restart includes the new process's start-up: `import torch, torchft, rustccl.torchft` "
                f"alone took {start_s:.2f} s.", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="configure rounds per backend")
    ap.add_argument("--recovery-rounds", type=int, default=2)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--step-ms", type=float, default=0.0, help="extra work per training step (sleep)")
    ap.add_argument("--machine", default=os.uname().nodename)
    ap.add_argument("--out", required=True, help="path without suffix")
    args = ap.parse_args()

    rows = configure(args.world, args.rounds)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TORCHFT_BENCH_DIR")) as d:
        for i in range(args.recovery_rounds):
            for b in BACKENDS if i % 2 == 0 else BACKENDS[::-1]:
                rows.append(dict(recovery(b, args.heartbeat_ms, args.step_ms, Path(d)), round=i))
    start_s = python_start()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(dict(r, machine=args.machine)) + "\n" for r in rows))
    md = report(rows, args.machine, start_s)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
