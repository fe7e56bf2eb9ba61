"""split_group, sparse all_reduce and shrink_group on CUDA tensors (one GPU
per rank). Skipped without 2 GPUs; run on the GPU machines."""

import pytest
import torch

import launch

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NGPU < 2, reason="needs 2 CUDA devices")]
WORLDS = sorted({2, NGPU} & set(range(2, 9)))


@pytest.mark.parametrize("world", WORLDS)
def test_split_group_and_sparse_on_cuda(world):
    launch.expect_ok(launch.run("w_cuda_groups:split", world, init="none", timeout=300))


@pytest.mark.parametrize("world", WORLDS)
def test_shrink_on_cuda(world):
    res = launch.run("w_cuda_groups:shrink", world, init="none", timeout=300, may_die=[world - 1])
    launch.expect_ok([r for r in res if r is not None])
