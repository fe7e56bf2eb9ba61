"""Every collective torch routes to a backend, on CPU tensors, with 2, 3 and 4
ranks, against references computed locally (see w_collectives.py)."""

import pytest

import launch

# Small segments and thresholds reach the multi-segment ring and chain paths
# with test-sized inputs.
SMALL_PATHS = {
    "RUSTCCL_SEGMENT_BYTES": "4096",
    "RUSTCCL_SMALL_ALLREDUCE_BYTES": "1024",
    "RUSTCCL_SMALL_BROADCAST_BYTES": "1024",
}

BODIES = ["all_reduce_matrix", "async_and_layouts", "rooted_and_gathers", "coalesced_and_async_variants", "p2p"]


# shm-attach: every collective between the processes reads the peers'
# tensors directly (cross-memory attach from 0 bytes); 2 and 3 ranks.
# two-hosts: 4 ranks on two simulated hosts (RUSTCCL_HOST_ID), shared
# memory within a host and TCP between: the hierarchical collectives, and
# point-to-point engines with peers of both kinds.
CASES = [(t, w) for t in ("shm", "tcp") for w in (2, 3, 4)] + [("shm-attach", 2), ("shm-attach", 3), ("two-hosts", 4)]


@pytest.mark.parametrize("transport,world", CASES)
@pytest.mark.parametrize("body", BODIES)
def test_collectives(body, world, transport):
    # slots of exactly RUSTCCL_SHM_SEGMENT_BYTES a thread (no 2 MiB floor)
    env = dict(SMALL_PATHS, RUSTCCL_TRANSPORT=transport.removesuffix("-attach"), RUSTCCL_SHM_SMALL_BYTES="1024",
               RUSTCCL_SHM_SEGMENT_BYTES="4096", RUSTCCL_SHM_SLOT_MIN_BYTES="0", RUSTCCL_SHM_RING_BYTES="65536")
    if transport == "two-hosts":
        env.update(RUSTCCL_TRANSPORT="auto", RUSTCCL_TEST_HOSTS="2")
    if transport == "shm":
        # copies split over a team of 2 threads a rank that spins when
        # idle, the phases of up to 512 KiB over a quick team of 2 beside it,
        # in pieces from 1 KiB (the workers' own: a 4 KiB slot)
        env.update(RUSTCCL_SHM_THREADS="2", RUSTCCL_SHM_SPIN_US="100", RUSTCCL_SHM_QUICK_THREADS="2",
                   RUSTCCL_SHM_QUICK_MIN_PIECE_BYTES="1024")
    if transport == "shm-attach":
        # a root's solo phases (gather's reads, scatter's slot copies) of
        # more than one 1 KiB piece on a pool of 3 threads (the ranks' own: 1);
        # broadcast reads the root's tensor only with its own setting;
        # the pool's threads sleep as soon as they are idle (no spinning);
        # sends over 128 KiB up to 4 MiB are staged while the staging area
        # is free (set: the host gives ranks of one thread none), the
        # others read by their receiver, and split: the sender writes the
        # second half; a scatter's blocks split up to 4 KiB, read whole
        # beyond; waits sleep at once (no polling window)
        env.update(RUSTCCL_SHM_STAGED_SEND_MAX_BYTES="4194304", RUSTCCL_SHM_WAIT_SPIN_US="0", RUSTCCL_SHM_ATTACH_MIN_BYTES="0", RUSTCCL_SHM_THREADS="1", RUSTCCL_SHM_ROOT_THREADS="3",
                   RUSTCCL_SHM_MIN_PIECE_BYTES="1024", RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES="0",
                   RUSTCCL_SHM_SPIN_US="0", RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES="0",
                   RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES="4096")
    launch.expect_ok(launch.run(f"w_collectives:{body}", world, env=env, timeout=240))


@pytest.mark.parametrize("wait_us", ["20000", "0"])
@pytest.mark.parametrize("world", [2, 3])
def test_streamed_blocks(world, wait_us):
    """all_to_all / gather / scatter blocks of many chunks streamed through
    the senders' slots between processes (w_collectives.streamed_blocks):
    2 threads a rank, 256 KiB slots, blocks up to 4 MiB through them while
    they fit, 1 KiB small slots; RUSTCCL_SHM_BLOCK_WAIT_US=0 hands every
    wait for a chunk to the rank's own thread."""
    env = launch.streamed_blocks_env(wait_us)
    launch.expect_ok(launch.run("w_collectives:streamed_blocks", world, env=env, timeout=240))


@pytest.mark.parametrize("threads", [None, "2", "4"])
def test_default_thresholds_all_reduce(threads):
    """The shipped thresholds on a 3-rank group: none overridden, or only
    the threads (2 a rank: 512 KiB slots; 4: 2 MiB, not 1 MiB)."""
    env = {"RUSTCCL_SHM_THREADS": threads} if threads else None
    launch.expect_ok(launch.run("w_collectives:all_reduce_matrix", 3, env=env, timeout=240))


@pytest.mark.parametrize("world", [2, 3])
def test_premul_sum(world):
    """PREMUL_SUM is scaled in the torch backend, summed by the engine."""
    launch.expect_ok(launch.run("w_collectives:premul_sum", world, timeout=240))


def test_p2p_two_simulated_hosts():
    """Sends of up to 32 MiB between two simulated hosts of 2 ranks each
    (shared memory within, TCP between), one way and both ways, batched
    with sends within the host."""
    launch.expect_ok(launch.run("w_collectives:p2p_two_hosts", 4, env={"RUSTCCL_TEST_HOSTS": "2"}, timeout=120))


def test_collectives_and_sends_beside_busy_processes():
    """With a busy process per core beside the ranks (a training job's
    compute), the waits sleep and run the engines themselves: every
    message and collective still carries the right data."""
    from rustccl.bench.load import busy

    with busy(1):
        res = launch.run("w_collectives:beside_busy_processes", 3, timeout=300)
    assert res[0] == res[1] == 27 and res[2] == 18, res
