"""CUDA tensors through NCCL (one GPU per rank). Skipped without 2 GPUs;
run on the GPU machines with scripts/gpu_check.sh."""

import pytest
import torch

import launch

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NGPU < 2, reason="needs 2 CUDA devices")]
WORLDS = sorted({2, NGPU} & set(range(2, 9)))


@pytest.mark.parametrize("world", WORLDS)
def test_cuda_collectives(world):
    launch.expect_ok(launch.run("w_cuda:matrix", world, timeout=600))


@pytest.mark.parametrize("world", WORLDS)
def test_cuda_semantics(world):
    launch.expect_ok(launch.run("w_cuda:semantics", world, timeout=300))


@pytest.mark.parametrize("world", WORLDS)
def test_cuda_ddp_matches_nccl(world):
    launch.expect_ok(launch.run("w_cuda:ddp_parity", world, 3, timeout=300))


def test_eager_connect_with_device_id():
    launch.expect_ok(launch.run("w_cuda:eager", 2, init="none", timeout=300))


@pytest.mark.parametrize("world", WORLDS)
def test_one_shot_all_reduce(world):
    launch.expect_ok(launch.run("w_cuda:one_shot", world, timeout=300))


def test_one_shot_off_uses_nccl():
    launch.expect_ok(launch.run("w_cuda:one_shot", 2, timeout=300, env={"RUSTCCL_CUSTOM_ALLREDUCE": "0", "RUSTCCL_TEST_EXPECT_NCCL": "1"}))


@pytest.mark.parametrize("world", WORLDS)
def test_cuda_graph_capture(world):
    launch.expect_ok(launch.run("w_cuda:graphs", world, timeout=300))


def test_one_shot_stalled_peer_times_out():
    launch.expect_ok(launch.run("w_cuda:stalled_peer", 2, timeout=120, pg_timeout=4))
