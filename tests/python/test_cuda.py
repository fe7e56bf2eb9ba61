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


# NVLink peer-memory paths (w_cuda_peer.py): two-shot all_reduce (every size
# above 16 B takes it here), all_gather_into_tensor / reduce_scatter_tensor.
@pytest.mark.parametrize("world", WORLDS)
def test_two_shot_all_reduce(world):
    launch.expect_ok(launch.run("w_cuda_peer:two_shot", world, timeout=300, env={"RUSTCCL_ONE_SHOT_MAX_BYTES": "16"}))


@pytest.mark.parametrize("world", WORLDS)
def test_peer_gather_scatter(world):
    launch.expect_ok(launch.run("w_cuda_peer:gather_scatter", world, timeout=300))


def test_peer_paths_off_use_nccl():
    env = {"RUSTCCL_CUSTOM_ALLREDUCE": "0", "RUSTCCL_TEST_EXPECT_NCCL": "1", "RUSTCCL_ONE_SHOT_MAX_BYTES": "16"}
    launch.expect_ok(launch.run("w_cuda_peer:gather_scatter", 2, timeout=300, env=env))
    launch.expect_ok(launch.run("w_cuda_peer:two_shot", 2, timeout=300, env=env))


def test_peer_setup_fails_without_peers_uses_nccl():
    launch.expect_ok(launch.run("w_cuda_peer:no_peers", 2, init="none", timeout=300))


@pytest.mark.parametrize("world", WORLDS)
def test_peer_graph_capture(world):
    launch.expect_ok(launch.run("w_cuda_peer:graphs", world, timeout=300))


@pytest.mark.parametrize("op", ["two_shot", "all_gather", "reduce_scatter"])
def test_peer_stalled_peer_times_out(op):
    launch.expect_ok(launch.run("w_cuda_peer:stalled_peer", 2, op, timeout=120, pg_timeout=4))
