"""A /dev/shm too small for the ranks' shared-memory segments (Docker's
default is 64 MiB) must not kill ranks with SIGBUS when the segments fill:
each rank reserves its segment's memory when creating it, a rank that gets
no room uses TCP with its local peers, and the job gives correct results.
With RUSTCCL_TRANSPORT=shm the group fails to start with a message naming
/dev/shm. Needs root (a mount namespace with a small tmpfs on /dev/shm)."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(size: str, extra_env: dict) -> subprocess.CompletedProcess:
    cmd = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} -m torch.distributed.run "
           f"--standalone --nproc-per-node 4 {os.path.join(HERE, 'w_shm_space.py')}")
    env = dict(os.environ, OMP_NUM_THREADS="1", RUSTCCL_DEBUG="WARN", **extra_env)
    return subprocess.run(["unshare", "-m", "sh", "-c", cmd], env=env, capture_output=True, text=True, timeout=240)


def _skip_unless_possible():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a mount namespace for a small /dev/shm)")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1M tmpfs /dev/shm"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace: {probe.stderr!r}")


@pytest.mark.parametrize("size", ["6M", "20M"])
def test_small_dev_shm_falls_back_to_tcp(size):
    """6 MiB: no rank gets a segment; 20 MiB: one or two do (every rank
    reserves its segment without the staging area first), the others do
    not: ranks with shared-memory and TCP peers at once, whose sends to
    TCP peers must go on when a socket fills."""
    _skip_unless_possible()
    p = _run(size, {})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert out.count("PASS rank") == 4, out[-4000:]
    assert "/dev/shm has no room" in out and "using TCP" in out, out[-4000:]
    assert "SIGBUS" not in out and "Signal 7" not in out, out[-4000:]


def test_dev_shm_without_room_for_staging_areas_keeps_shared_memory():
    """50 MiB: room for the four segments (~9.8 MiB each here), not for
    their 4 MiB staging areas too: a rank that finds too little room goes
    without one (its large sends are read directly), and every rank keeps
    shared memory with every other."""
    _skip_unless_possible()
    # a 4 MiB staging area whatever this host's reads (where they are slow,
    # the host's rule makes none)
    p = _run("50M", {"RUSTCCL_SHM_STAGED_SEND_MAX_BYTES": "4194304"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert out.count("PASS rank") == 4 and out.count("local_ranks=4") == 4, out[-4000:]
    assert "no room for a 4194304-byte staging area" in out, out[-4000:]
    assert "using TCP" not in out, out[-4000:]


def test_small_dev_shm_with_shm_required_fails_clearly():
    _skip_unless_possible()
    p = _run("6M", {"RUSTCCL_TRANSPORT": "shm"})
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-4000:]
    assert "RUSTCCL_TRANSPORT=shm, but shared memory failed" in out and "/dev/shm has no room" in out, out[-4000:]
