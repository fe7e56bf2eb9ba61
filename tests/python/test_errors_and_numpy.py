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


def test_debug_info_names_the_algorithms_of_the_transport_in_use(tmp_path):
    """RUSTCCL_DEBUG=INFO says which all_reduce algorithms the group uses:
    shared memory's between ranks of one host, the TCP ones otherwise."""
    script = tmp_path / "job.py"
    script.write_text("import torch, torch.distributed as dist, rustccl\n"
                      "dist.init_process_group('rustccl'); dist.all_reduce(torch.ones(4)); dist.destroy_process_group()\n")
    seen = {}
    for transport in ("auto", "tcp"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUSTCCL_")}
        env.update(RUSTCCL_DEBUG="INFO", RUSTCCL_TRANSPORT=transport, OMP_NUM_THREADS="1")
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        seen[transport] = [ln for ln in p.stderr.splitlines() if "connected over" in ln]
    assert seen["auto"] and all("over shm" in ln and "shared memory" in ln and "recursive doubling" not in ln
                                for ln in seen["auto"]), seen
    assert seen["tcp"] and all("over tcp" in ln and "recursive doubling" in ln for ln in seen["tcp"]), seen


def test_a_device_spec_backend_destroys_without_a_warning(tmp_path):
    """init_process_group("cpu:rustccl") runs, and its destroy says nothing
    (torch left such a group without a default backend and warned)."""
    script = tmp_path / "job.py"
    script.write_text("import torch, torch.distributed as dist, rustccl\n"
                      "dist.init_process_group('cpu:rustccl'); x = torch.ones(3); dist.all_reduce(x)\n"
                      "print('sum', x.tolist()); dist.destroy_process_group()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUSTCCL_")}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                       env=dict(env, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("[2.0, 2.0, 2.0]") == 2, p.stdout  # the ranks' lines may interleave
    assert "No backend of type" not in p.stderr, p.stderr[-3000:]
