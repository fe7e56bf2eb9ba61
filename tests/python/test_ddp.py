"""DistributedDataParallel over rustccl matches gloo on the same model, data
and seeds; the README demo runs under torchrun."""

import os
import re
import subprocess
import sys

import pytest

import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_gradients_match_gloo(world):
    launch.expect_ok(launch.run("w_misc:ddp_parity", world, 4))


def test_demo_under_torchrun():
    """The README's main job, shortened: 2 ranks, loss printed per step."""
    port = launch.free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           os.path.join(ROOT, "examples", "train_ddp.py"), "--steps", "4", "--size", "256", "--batch", "32"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    losses = [float(m) for m in re.findall(r"step\s+\d+\s+loss\s+([0-9.eE+-]+)", out.stdout)]
    assert len(losses) == 4, out.stdout
    assert all(x == x and x > 0 for x in losses)  # finite, positive
    assert "backend=rustccl" in out.stdout
