"""Shared tensors (RUSTCCL_SHM_TENSORS=1): torch's CPU tensors from 64 KiB
on live in memory the other ranks of the host map, and rustccl's
collectives and sends between them read them with a plain copy instead of
through the kernel. Every path against local references (w_shm_tensors.py),
with the host's thresholds (no overrides); tensors outside the arena
(numpy memory) in the same calls."""

import pytest

import launch

SHARED = {"RUSTCCL_SHM_TENSORS": "1", "RUSTCCL_TRANSPORT": "shm"}


@pytest.mark.parametrize("world,threads", [(2, "0"), (3, "2")])
@pytest.mark.parametrize("body", ["shared_collectives", "shared_sends"])
def test_shared_tensors(body, world, threads):
    """threads 0: from the host (one a rank on a 2-core machine: broadcast
    keeps its pipelined copies); 2: every rank reads the root's tensor."""
    launch.expect_ok(launch.run(f"w_shm_tensors:{body}", world, env=dict(SHARED, RUSTCCL_SHM_THREADS=threads), timeout=240))


@pytest.mark.parametrize("stage", ["0", "1"])
def test_sends_of_shared_tensors_are_read_or_staged(stage):
    """A 4 MiB staging area set by hand (ranks of 1-2 threads get none from
    the host): a shared tensor's send is staged only with the setting."""
    env = dict(SHARED, RUSTCCL_SHM_STAGE_SHARED_SENDS=stage, RUSTCCL_SHM_STAGED_SEND_MAX_BYTES=str(4 << 20))
    launch.expect_ok(launch.run("w_shm_tensors:shared_send_staging", 2, env=env, timeout=240))


@pytest.mark.parametrize("threads", ["1", "4"])
def test_a_crowded_host_reads_all_reduce_from_8_and_all_gather_from_16_mib(threads):
    """8 ranks: with 4 threads each (32 among them) the host is crowded."""
    launch.expect_ok(launch.run("w_shm_tensors:crowded_host", 8, env=dict(SHARED, RUSTCCL_SHM_THREADS=threads), timeout=300))


def test_more_than_four_ranks_read_blocks_from_32_kib():
    launch.expect_ok(launch.run("w_shm_tensors:shared_collectives", 5, env=SHARED, timeout=300))


def test_ddp_with_shared_buckets_matches_gloo():
    launch.expect_ok(launch.run("w_shm_tensors:ddp_matches_gloo", 2, env=SHARED, timeout=240))


def test_settings_made_after_the_import_still_count():
    launch.expect_ok(launch.run("w_shm_tensors:settings_after_import", 2, init="none", env=SHARED, timeout=240))


def test_a_forked_child_keeps_its_parents_tensors_apart():
    launch.expect_ok(launch.run("w_shm_tensors:fork_keeps_tensors_apart", 2, env=SHARED, timeout=240))
