"""Unsupported input raises a RuntimeError naming rustccl, the collective
and the reason, and the group keeps working; the torch-free numpy API."""

import os
import subprocess
import sys
import tempfile

import launch


def test_unsupported_input_errors():
    launch.expect_ok(launch.run("w_misc:errors", 2))


def test_numpy_communicator():
    launch.expect_ok(launch.run("w_misc:numpy_api", 3, tempfile.mkdtemp(prefix="rustccl-np-"), init="none"))


def _one_rank(env: dict) -> subprocess.CompletedProcess:
    """A one-rank job that creates a group, runs an all_reduce and a second
    group, under `env` over this process's environment."""
    code = (
        "import torch, torch.distributed as dist, rustccl\n"
        f"dist.init_process_group('rustccl', init_method='tcp://127.0.0.1:{launch.free_port()}', rank=0, world_size=1)\n"
        "t = torch.ones(3); dist.all_reduce(t); dist.new_group([0])\n"
        "dist.destroy_process_group(); print('sum', t.tolist())\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUSTCCL_")}
    return subprocess.run([sys.executable, "-c", code], env=dict(clean, **env), capture_output=True, text=True, timeout=120)


def test_a_misspelled_setting_is_named_once_with_the_closest_one():
    p = _one_rank({"RUSTCCL_TRANSPRT": "tcp"})
    assert p.returncode == 0 and "sum [1.0, 1.0, 1.0]" in p.stdout, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "RUSTCCL_TRANSPRT" in ln]
    assert len(lines) == 1, p.stderr
    assert "no such setting (did you mean RUSTCCL_TRANSPORT?)" in lines[0], lines


def test_a_bad_setting_value_fails_group_creation():
    p = _one_rank({"RUSTCCL_TRANSPORT": "carrier-pigeon"})
    assert p.returncode != 0 and "sum" not in p.stdout, (p.stdout, p.stderr)
    assert 'RUSTCCL_TRANSPORT="carrier-pigeon": not auto, tcp or shm' in p.stderr, p.stderr
    assert "fix or unset it" in p.stderr, p.stderr


def test_torch_distributed_debug_detail_works_and_catches_a_shape_mismatch():
    """torch's first debugging step, TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    res = launch.run("w_misc:debug_detail", 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for r in range(2):
        got = res[r]
        assert got["sum"] == [3.0] * 4 and got["gathered"] == [[0.0] * 4, [1.0] * 4] and got["bcast"] == [0.0] * 3, got
        assert got["err"] is not None and "mismatch" in got["err"].lower(), got
        assert got["after"] == [2.0, 2.0], got
