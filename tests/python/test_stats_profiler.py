"""rustccl.stats() counters move by the right amounts; collectives appear in
torch.profiler traces by name; RUSTCCL_DEBUG logs communicator creation."""

import os
import subprocess
import sys

import pytest

import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stats_counters():
    launch.expect_ok(launch.run("w_stats:counters", 3))


@pytest.mark.parametrize("transport,split,expect", [("shm", "off", "shm_read"), ("shm", "1048576", "shm_split"), ("tcp", "off", "direct")])
def test_stats_count_how_each_message_crossed(transport, split, expect):
    """stats() counts sends and receives per route: staged (the 200 KiB
    sends, each taken out of the sender's staging area before its receive
    was posted, so every one found the area free), ring (the small ones),
    and the 12 MiB one read by the receiver or split with the sender; over
    TCP all direct. Without the early take, the later 200 KiB sends go
    through the ring."""
    env = {"RUSTCCL_TRANSPORT": transport, "RUSTCCL_SHM_STAGED_SEND_MAX_BYTES": str(8 << 20), "RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES": split}
    launch.expect_ok(launch.run("w_stats:p2p_routes", 2, expect, env=env))


def test_waiting_thread_runs_blocking_collectives():
    launch.expect_ok(launch.run("w_stats:caller_runs", 3, env={"RUSTCCL_CALLER_RUNS_US": "5000000"}))


def test_profiler_events():
    launch.expect_ok(launch.run("w_stats:profiler", 2))


def test_debug_logging():
    port = launch.free_port()
    env = dict(os.environ, RUSTCCL_DEBUG="TRACE", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           os.path.join(ROOT, "examples", "train_ddp.py"), "--steps", "1", "--size", "64", "--batch", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    err = out.stderr
    assert "connected over shm" in err and "in one round, pipelined above" in err, err[-3000:]
    assert "all_reduce seq" in err, "TRACE logs each collective"


@pytest.mark.parametrize("keep_apart", ["1", "0"])
def test_waiting_threads_keep_apart(keep_apart):
    """Two ranks' waiting threads put on one CPU: the higher rank's moves
    off it (unless RUSTCCL_SHM_KEEP_APART=0), masks kept, messages intact."""
    launch.expect_ok(launch.run("w_stats:keep_apart", 2, env={"RUSTCCL_SHM_KEEP_APART": keep_apart, "RUSTCCL_TRANSPORT": "shm"}))
