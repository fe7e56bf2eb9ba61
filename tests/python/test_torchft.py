"""rustccl as torchft's process group (``rustccl.torchft``): every op
through torchft's wrapper, a dead peer failing every survivor long before the
timeout, abort interrupting a waiting collective, reconfiguration, and a
replica killed with SIGKILL mid-training that restarts, heals from a live
replica and trains in step with it (examples/train_torchft.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchft")

from torch.distributed import AllreduceOptions  # noqa: E402
from torchft._torchft import LighthouseServer  # noqa: E402

import rustccl  # noqa: E402
from rustccl.torchft import ProcessGroupRustccl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LONG = timedelta(seconds=60)


def configured(n: int, store: dist.TCPStore, prefix: str, transport: str = "shm") -> list[ProcessGroupRustccl]:
    """n ranks of one rustccl group, configured by threads as torchft does."""
    pgs = [ProcessGroupRustccl(timeout=LONG, options=rustccl.Options(RUSTCCL_TRANSPORT=transport)) for _ in range(n)]
    on_threads(lambda r: pgs[r].configure(f"localhost:{store.port}/{prefix}", "replica", r, n), range(n))
    return pgs


def on_threads(fn, ranks) -> list:
    """fn(rank) on one thread per rank; the results, or the exceptions."""
    out: dict = {}

    def run(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out[r] = e

    ts = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return [out[r] for r in ranks]


def allreduce(pg, x: torch.Tensor) -> torch.Tensor:
    """x summed over the group; raises what errored() reports if it failed
    (wait() returns False then, as torchft's NCCL group's does)."""
    work = pg.allreduce([x], AllreduceOptions())
    if not work.wait():
        with pytest.raises(Exception) as failed:
            work.get_future().wait()  # the future holds the error too
        assert str(failed.value).split("\n")[0].endswith(str(pg.errored()).split("\n")[0])
        raise pg.errored()
    return x


@pytest.fixture
def store():
    return dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)


def test_every_op_through_the_wrapper_and_ddp_over_it(store):
    import torchft.process_group_test as pgt

    (pg,) = configured(1, store, "one")
    assert pg.getBackendName() == "torchft-rustccl"
    assert pg.size() == 1
    # torchft's own check of every op's shapes and dtypes, with futures
    pgt._test_pg(pg, torch.tensor([2]))
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 4), process_group=pg)
    m(torch.rand(2, 3)).sum().backward()
    pg.shutdown()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_dead_peer_fails_every_survivor_and_a_reconfigure_goes_on(store, transport):
    pgs = configured(3, store, f"dead-{transport}", transport)
    got = on_threads(lambda r: allreduce(pgs[r], torch.full((1000,), float(r + 1))), range(3))
    for x in got:
        assert torch.equal(x, torch.full((1000,), 6.0))
    # rank 2 goes away between steps; the group's timeout is 60 s, so only
    # rustccl's dead-peer detection can end the survivors' next call
    pgs[2].abort()
    got = on_threads(lambda r: allreduce(pgs[r], torch.ones(1000)), range(2))
    for r, e in enumerate(got):
        assert isinstance(e, Exception), f"rank {r}: an all_reduce without rank 2 returned {e}"
        # over TCP one survivor may see the other give up first and name it
        assert "rustccl all_reduce" in str(e) and "connection closed by peer" in str(e), str(e)
        assert "connection closed by peer" in str(pgs[r].errored())
    # the survivors' next quorum: a fresh group of two
    on_threads(lambda r: pgs[r].configure(f"localhost:{store.port}/again-{transport}", "replica", r, 2), range(2))
    got = on_threads(lambda r: allreduce(pgs[r], torch.full((1000,), float(r + 1))), range(2))
    for r, x in enumerate(got):
        assert torch.equal(x, torch.full((1000,), 3.0)), f"rank {r}: {x}"
        assert pgs[r].errored() is None
    for pg in pgs[:2]:
        pg.shutdown()


def test_abort_interrupts_a_collective_waiting_on_a_peer(store):
    pgs = configured(2, store, "abort")
    work = pgs[0].allreduce([torch.ones(4)], AllreduceOptions())  # rank 1 never joins
    threading.Timer(0.2, pgs[0].abort).start()
    assert work.wait() is False
    with pytest.raises(Exception, match="rustccl all_reduce: the process group was shut down or aborted"):
        work.get_future().wait()
    assert "aborted" in str(pgs[0].errored())
    # The peer's matching call finds either rank 0's input, published
    # before the abort (a complete result), or rank 0 gone; its next call
    # fails, long before the timeout.
    try:
        assert torch.equal(allreduce(pgs[1], torch.ones(4)), torch.full((4,), 2.0))
    except Exception as e:  # noqa: BLE001
        assert "rank 0" in str(e), str(e)
    with pytest.raises(Exception, match="rank 0"):
        allreduce(pgs[1], torch.ones(4))
    assert pgs[1].errored() is not None


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tail(p: subprocess.Popen) -> str:
    """The end of a replica's output, without torchft's per-step log lines."""
    lines = Path(p.stdout_path).read_text(errors="replace").splitlines() if hasattr(p, "stdout_path") else []
    return "\n".join(line for line in lines if "[INFO]" not in line)[-4000:]


def _wait_for(cond, what: str, procs, limit: float = 180.0) -> None:
    t0 = time.monotonic()
    while not cond():
        for p in procs:
            if p.poll() not in (None, 0):
                raise AssertionError(f"a replica failed ({p.args}) while waiting for {what}:\n{_tail(p)}")
        assert time.monotonic() - t0 < limit, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_a_killed_replica_rejoins_and_matches_its_donor(tmp_path):
    """Two replicas (processes) train; replica 1 is SIGKILLed mid-training,
    replica 0 trains on alone, replica 1 restarts, heals from replica 0 and
    both finish with the same parameters; at every step they both committed,
    their parameters are equal."""
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, quorum_tick_ms=50,
                                  heartbeat_timeout_ms=1000)
    env = dict(os.environ, TORCHFT_LIGHTHOUSE=lighthouse.address(), OMP_NUM_THREADS="1")
    steps = 150
    logs = [tmp_path / "replica0.jsonl", tmp_path / "replica1.jsonl"]
    outs: list = []

    def start(rid: int) -> subprocess.Popen:
        cmd = [sys.executable, str(ROOT / "examples/train_torchft.py"), "--replica-id", str(rid),
               "--steps", str(steps), "--step-ms", "40", "--log", str(logs[rid])]
        # a file, not a pipe: torchft logs every step, and a full pipe
        # would stop the replica in the middle of one
        out = open(tmp_path / f"replica{rid}-{len(outs)}.log", "wb")
        outs.append(out)
        p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        p.stdout_path = out.name
        return p

    procs = [start(0), start(1)]
    try:
        # both in one quorum for a few steps
        _wait_for(lambda: sum(r["participants"] == 2 for r in _records(logs[1])) >= 3, "a 2-replica step", procs)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        killed_at = max(r["step"] for r in _records(logs[0]))
        logs[1].rename(tmp_path / "replica1-before.jsonl")
        procs[1] = start(1)  # replica 0 trains alone while it starts
        for p in procs:
            p.wait(timeout=240)
            assert p.returncode == 0, _tail(p)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for out in outs:
            out.close()
        lighthouse.shutdown()

    zero = {r["step"]: r for r in _records(logs[0])}
    rejoined = _records(logs[1])
    assert rejoined, "the restarted replica committed no step"
    assert rejoined[0]["step"] > killed_at, "the restarted replica began at step 0 instead of healing"
    assert any(r["participants"] == 2 for r in rejoined), "the restarted replica never trained with the other"
    alone = [s for s, r in zero.items() if s > killed_at and s < rejoined[0]["step"] and r["participants"] == 1]
    assert alone, "replica 0 did not train on while replica 1 was gone"
    for r in rejoined:
        # the restarted replica equals its donor from the step it joined on
        assert r["checksum"] == zero[r["step"]]["checksum"], f"step {r['step']}: parameters differ"
    assert rejoined[-1]["step"] == zero[max(zero)]["step"] == steps


def test_every_group_it_builds_gets_the_codec(store):
    pgs = [ProcessGroupRustccl(timeout=LONG, compression="int8") for _ in range(2)]
    for q in (1, 2):
        on_threads(lambda r: pgs[r].configure(f"localhost:{store.port}/codec{q}", "replica", r, 2, quorum_id=q), range(2))
        assert rustccl.compression(f"torchft_quorum_{q}_rank_0") == ("int8", True)
        # one host: the codec applies between hosts only, so the sum is exact
        got = on_threads(lambda r: allreduce(pgs[r], torch.full((1000,), 0.1 * (r + 1))), range(2))
        assert all(torch.equal(x, torch.full((1000,), 0.1) + torch.full((1000,), 0.2)) for x in got)
    with pytest.raises(ValueError, match="int3"):
        ProcessGroupRustccl(compression="int3")
