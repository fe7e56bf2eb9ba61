"""rustccl.hooks and rustccl.bucketing over rustccl: exact where lossless,
convergent where lossy, checkpointable, and the bucketer equal to DDP."""

import pytest
import torch

import launch
from rustccl.bucketing import LATENCY_FRACTION, MAX_BUCKET_BYTES, MIN_BUCKET_BYTES, choose_bucket_bytes


@pytest.mark.parametrize("world", [2, 3])
def test_hooks_match_local_references(world):
    """Every hook on hand-built buckets vs references computed in the test;
    byte counts; state_dict round trips; memory across bucket regrouping."""
    launch.expect_ok(launch.run("w_hooks:exact", world))


def test_ddp_training_with_each_hook():
    """300 SGD steps of DDP on a teacher-student regression, 2 ranks."""
    results = launch.run("w_hooks_ddp:convergence", 2, 300, 0.05)
    launch.expect_ok(results)
    losses = results[0][2]
    assert all(losses[k][1] == results[1][2][k][1] for k in losses), "ranks disagree on the final model"
    first, base = losses["none"]
    assert base < 0.3 * first, f"the baseline must learn: {losses}"
    # lossless: the same training as DDP's own all-reduce
    assert losses["allreduce"][1] == pytest.approx(base, rel=1e-4), losses
    # casts and int8 (error feedback): within 1% of uncompressed training
    for name in ("fp16", "bf16", "int8"):
        assert losses[name][1] == pytest.approx(base, rel=0.01), (name, losses)
    # PowerSGD rank 2 and top-k 1% with error feedback: within 5%
    for name in ("powersgd", "topk"):
        assert losses[name][1] == pytest.approx(base, rel=0.05), (name, losses)
    # error feedback is what makes 1% top-k work
    assert losses["topk_no_ef"][1] > 1.5 * losses["topk"][1], losses


def test_ddp_checkpoint_resumes_identically():
    launch.expect_ok(launch.run("w_hooks_ddp:checkpoint", 2, 5, 0.05))


@pytest.mark.parametrize("world", [2, 3])
def test_bucketer_matches_ddp(world):
    launch.expect_ok(launch.run("w_bucketing:vs_ddp", world, 4))


def test_bucketer_features():
    """Unused parameters, comm hooks, errors, the measured bucket size."""
    launch.expect_ok(launch.run("w_bucketing:features", 3))


@pytest.mark.parametrize("alpha,beta", [(50e-6, 1 / 2e9), (1e-3, 1e-9), (20e-6, 1 / 300e9)])
def test_bucket_size_keeps_latency_small(alpha, beta):
    n = choose_bucket_bytes(alpha, beta)
    assert MIN_BUCKET_BYTES <= n <= MAX_BUCKET_BYTES
    if MIN_BUCKET_BYTES < n < MAX_BUCKET_BYTES:
        assert alpha / (alpha + beta * n) == pytest.approx(LATENCY_FRACTION, rel=1e-3)
    else:  # clamped: the unclamped size lies beyond the clamp
        unclamped = alpha * (1 - LATENCY_FRACTION) / (LATENCY_FRACTION * beta)
        assert (n == MAX_BUCKET_BYTES) == (unclamped > MAX_BUCKET_BYTES)


def test_bucket_size_clamps():
    assert choose_bucket_bytes(1e-9, 1e-9) == MIN_BUCKET_BYTES
    assert choose_bucket_bytes(1.0, 1e-12) == MAX_BUCKET_BYTES


def test_hooks_rustccl_vs_gloo():
    """The device-parity body on CPU: rustccl's results equal gloo's."""
    launch.expect_ok(launch.run("w_hooks_device:device_parity", 2, "cpu"))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("backend", ["nccl", "rustccl"])
def test_hooks_on_cuda(backend):
    """The same on CUDA tensors, default group nccl or rustccl."""
    launch.expect_ok(launch.run("w_hooks_device:device_parity", 2, "cuda", backend=backend))


@pytest.mark.parametrize("world", [2, 3])
def test_torchs_own_powersgd_hook_trains(world):
    """torch's PowerSGD hook starts an all_reduce inside a future's callback
    and waits for it: that must not deadlock (it does on gloo), and it must
    train about as well as plain all-reduce."""
    res = launch.run("w_hooks_ddp:torch_powersgd", world, 300, 0.05, timeout=300)
    losses = res[0]
    assert all(res[r] == losses for r in range(world)), res  # every rank holds the same model
    assert losses["none"] < 0.5 * losses["untrained"], losses  # the baseline learns
    for name in ("powersgd1", "powersgd4"):
        assert losses[name] == pytest.approx(losses["none"], rel=0.05), losses
