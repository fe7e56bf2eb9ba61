"""Nothing hangs, nothing leaks: timeouts, dead peers, aborts, mismatched
input and init/destroy cycles (CPU). Short group timeouts keep these fast."""

import os
import tempfile

import pytest

import launch


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_stalled_rank_times_out_on_every_rank(transport):
    env = {"RUSTCCL_FAULT": "delay:rank=2:seq=1:ms=6000", "RUSTCCL_TRANSPORT": transport}
    res = launch.run("w_faults:stalled", 3, env=env, pg_timeout=2, timeout=120)
    for r in (0, 1):
        first, later = res[r]["first"], res[r]["later"]
        assert first["type"] == "DistBackendError", first
        assert " Timed out " in first["msg"] and "seq 1" in first["msg"] and "rustccl all_reduce" in first["msg"], first
        assert first["s"] < 2 + 3, f"rank {r} took {first['s']:.1f} s for a 2 s timeout"
        assert later["runtime_error"] and later["s"] < 1, later  # fails fast afterwards
        assert " Timed out " in later["msg"], later  # with the same cause
    # The late rank may still complete seq 1 (its peers' data had arrived
    # before they gave up), but its next collective fails at once.
    assert res[2]["later"]["runtime_error"] and res[2]["later"]["s"] < 5, res[2]


def test_wait_honours_its_own_timeout():
    res = launch.run("w_faults:wait_timeout", 2, env={"RUSTCCL_FAULT": "delay:rank=1:seq=0:ms=3000"}, pg_timeout=30)
    short = res[0]["short"]
    assert short["type"] == "DistBackendError" and " Timed out " in short["msg"] and "in wait()" in short["msg"], short
    assert 0.4 < short["s"] < 1.5, short
    assert res[0]["value"] == [3.0] * 8 and res[1]["value"] == [3.0] * 8  # the operation itself went on


@pytest.mark.parametrize("how", ["sigkill", "fault", "panic"])
def test_dead_rank_fails_survivors_promptly(how):
    """A rank killed, whose links a fault closes, or whose collective
    panics (`RUSTCCL_FAULT=panic`): the others fail at once, not at the
    timeout, and so do their later calls; the panicking rank's call fails
    naming the panic, and its later ones too."""
    env = {"RUSTCCL_FAULT": {"fault": "kill:rank=2:seq=1", "panic": "panic:rank=2:seq=1"}[how]} if how != "sigkill" else {}
    res = launch.run("w_faults:killed", 3, how, env=env, pg_timeout=60, timeout=120, may_die=[2])
    if how == "panic":
        first = res[2]["first"]
        assert first["runtime_error"] and "panicked" in first["msg"] and "RUSTCCL_FAULT: rank 2 panics" in first["msg"], first
        assert res[2]["later"]["runtime_error"] and res[2]["later"]["s"] < 1, res[2]
    for r in (0, 1):
        first = res[r]["first"]
        assert first["runtime_error"] and first["type"] in ("DistNetworkError", "DistBackendError"), first
        assert first["s"] < 10, f"rank {r} needed {first['s']:.1f} s (timeout 60 s)"
        assert "rustccl all_reduce (seq 1" in first["msg"], first
        assert res[r]["later"]["runtime_error"] and res[r]["later"]["s"] < 1


@pytest.mark.parametrize("wait_us", ["20000", "0"])
def test_a_rank_killed_inside_streamed_all_to_alls_fails_the_others_promptly(wait_us):
    """all_to_all blocks streamed through the senders' slots (settings:
    launch.streamed_blocks_env); rank 2 is killed while the
    ranks call it back to back. RUSTCCL_SHM_BLOCK_WAIT_US=0: every wait
    for a chunk goes to the rank's own thread, which checks the sender is
    alive."""
    env = launch.streamed_blocks_env(wait_us)
    res = launch.run("w_faults:killed_mid_stream", 3, env=env, pg_timeout=60, timeout=150, may_die=[2])
    for r in (0, 1):
        got = res[r]
        assert got["ok"] and got["algorithm"] == "shm_attach", got
        assert got["calls"] > 1, got  # the kill came while the calls ran, not before
        first = got["first"]
        assert first is not None and first["runtime_error"] and first["type"] in ("DistNetworkError", "DistBackendError"), got
        assert first["s"] < 10, f"rank {r} needed {first['s']:.1f} s (timeout 60 s)"
        assert "rustccl all_to_all" in first["msg"], first
        assert got["later"]["runtime_error"] and got["later"]["s"] < 1, got


def test_mismatched_sizes_fail_on_every_rank():
    res = launch.run("w_faults:mismatched", 2, pg_timeout=10)
    for r in (0, 1):
        bad = res[r]["bad"]
        assert bad["runtime_error"] and ("different tensor" in bad["msg"] or "different tensors" in bad["msg"]), bad


def test_rustccl_check_keeps_the_group_working():
    res = launch.run("w_faults:mismatched", 2, env={"RUSTCCL_CHECK": "1"}, pg_timeout=10)
    for r in (0, 1):
        bad, good = res[r]["bad"], res[r]["good"]
        assert bad["type"] == "RuntimeError" and "RUSTCCL_CHECK" in bad["msg"], bad
        assert "all_reduce(SUM) of [10] float32" in bad["msg"] and "[11]" in bad["msg"], bad
        assert good["type"] is None and res[r]["y"] == [2.0] * 4, res[r]


def test_flight_recorder_on_timeout():
    d = tempfile.mkdtemp(prefix="rustccl-fr-")
    res = launch.run("w_faults:flight", 2, d, env={"RUSTCCL_FLIGHT_RECORDER_DIR": d}, pg_timeout=2, timeout=60)
    assert res[0]["err"]["type"] == "DistBackendError", res[0]
    assert any(f.startswith("rustccl-flight-") and "rank0" in f for f in res[0]["files"]), res[0]["files"]
    entries = res[0]["record"]["entries"]
    states = [(e["seq"], e["op"], e["state"]) for e in entries]
    assert (5, "all_reduce", "done") in states and (6, "all_reduce", "failed") in states, states
    for e in entries:  # async ones too: queue time reads as started - queued
        assert e["started_at"] is None or e["started_at"] >= e["queued_at"], e
    failed = [e for e in entries if e["state"] == "failed"][0]
    assert " Timed out " in failed["error"] and failed["bytes"] == 64 and failed["dtype"] == "float32", failed


def test_abort_fails_a_stuck_collective():
    res = launch.run("w_faults:abort", 2, pg_timeout=60, timeout=60)
    out = res[0]["out"]
    assert out["runtime_error"] and out["since_abort"] < 6, out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_completed_send_is_received_after_its_sender_exited(transport):
    """4 KB through the ring and 1 MiB staged in the sender's shared
    memory (a staging area set for it: the 2-core VM has none by default),
    or over TCP: both arrive intact at a receive posted after the sender's
    process exited."""
    env = {"RUSTCCL_TRANSPORT": transport, "RUSTCCL_SHM_STAGED_SEND_MAX_BYTES": str(8 << 20)}
    res = launch.run("w_faults:send_then_exit", 2, env=env, pg_timeout=20, timeout=120)
    assert res[1]["gone"], res[1]
    if transport == "shm":
        assert res[0]["staged_max"] == 8 << 20, res[0]
    for k, got in enumerate(res[1]["got"]):
        assert got["err"]["type"] is None and got["equal"], (k, got)


def test_init_destroy_cycles_leak_nothing():
    res = launch.run("w_faults:cycles", 2, 200, init="none", timeout=400)
    for r in res:
        a, b = r["after_warmup"], r["end"]
        assert b["rustccl_threads"] == 0, r
        assert b["threads"] <= a["threads"], r
        assert b["fds"] <= a["fds"], r
        assert b["rss"] - a["rss"] < 64 << 20, r
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("rustccl-")]


EXIT_WITHOUT_DESTROY = r"""
import atexit
done = []
# registered before rustccl's own handler, so it runs after it (LIFO)
atexit.register(lambda: print("completed", len(done), flush=True))
import torch
import torch.distributed as dist
import rustccl
dist.init_process_group("rustccl")
x = torch.ones(1 << 20)
for _ in range(40):
    dist.all_reduce(x, async_op=True).get_future().then(lambda f: done.append(1))
print("queued", flush=True)
# no destroy_process_group, no wait
"""


def test_a_script_that_ends_without_destroy_finishes_its_queued_work_and_exits_cleanly():
    """At interpreter exit rustccl stops its engines after the queued work
    (atexit), instead of leaving their threads completing torch futures
    while the process destroys torch's C++ state (which aborted about 1 in
    15 such exits with "terminate called without an active exception")."""
    import subprocess
    import sys

    port = launch.free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", EXIT_WITHOUT_DESTROY], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, (p.returncode, out, err[-2000:])
        assert "terminate called" not in err, err[-2000:]
        assert "completed 40" in out, (out, err[-2000:])


def _no_mixed_result(name: str, seen: list[dict]) -> None:
    """Some rank failed the call `name`; a rank that finished it is one
    whose own result did not depend on the odd rank, and it holds the
    agreeing ranks' result."""
    assert any(s["type"] is not None for s in seen), (name, seen)
    for r, s in enumerate(seen):
        if s["type"] is None:
            assert s["want"] is not None, (name, r, s)
            assert s["want"] == "any" or s["got"] == s["want"], (name, r, {k: v for k, v in s.items() if k != "got"})
        else:
            assert s["runtime_error"] and "rustccl" in s["msg"], (name, r, s)


@pytest.mark.parametrize("world", [2, 3])
def test_tcp_dtype_or_op_mismatch_never_yields_a_result(world):
    """Over TCP (ranks on different hosts), a rank whose tensors have the
    same byte length as its peers' but another dtype, or another reduce op,
    fails; no rank ends a collective holding what a mixed call would give,
    and the rank that saw the difference names both sides in torch's words."""
    res = launch.run("w_faults:tcp_mismatch", world, env={"RUSTCCL_TRANSPORT": "tcp"}, pg_timeout=20, timeout=240)
    names = [k for k in res[0] if k != "send_recv"]
    assert len(names) == 10, names
    for name in names:
        seen = [res[r][name] for r in range(world)]
        _no_mixed_result(name, seen)
        detail = " ".join(s["msg"] for s in seen)
        if name == "all_reduce_op":
            assert "all_reduce(MAX)" in detail and "all_reduce(SUM)" in detail, (name, detail)
        elif name == "all_reduce_f64":
            assert "4 x float64" in detail and "8 x float32" in detail, (name, detail)
        else:
            assert "int32" in detail and "float32" in detail and "RUSTCCL_CHECK=1" in detail, (name, detail)
    recv = res[1]["send_recv"]
    assert recv["runtime_error"] and "8 x int32" in recv["msg"] and "8 x float32" in recv["msg"], recv
    assert recv["got"] == [0] * 8, recv


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("world", [2, 3])
def test_a_mismatch_fails_the_call_and_the_group_goes_on(world, transport):
    """The last rank passes another size (40 B, 1 MiB, 16 MiB: every
    all_reduce and broadcast algorithm), dtype or reduce op than the
    others, in one group. The call fails on every rank whose result
    depends on it (a rank whose part was over may return, with the
    agreeing ranks' result), and a correct all_reduce after it gives the
    right sum on every rank."""
    env = {"RUSTCCL_TRANSPORT": "tcp"} if transport == "tcp" else {}
    res = launch.run("w_faults:mismatch_then_go_on", world, env=env, pg_timeout=30, timeout=300)
    want_sum = [float(world * (world + 1) // 2)] * 5
    names = list(res[0])
    assert len(names) == 19, names
    for name in names:
        seen = [res[r][name] for r in range(world)]
        _no_mixed_result(name, seen)
        for r, s in enumerate(seen):
            if s["type"] is not None:
                assert "the group stays usable" in s["msg"], (name, r, s["msg"])
                assert "unusable" not in s["msg"], (name, r, s["msg"])
            after = s["after"]
            assert after["type"] is None and after["y"] == want_sum, (name, r, after)
