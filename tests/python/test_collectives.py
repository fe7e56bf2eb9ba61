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


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("body", BODIES)
def test_collectives(body, world, transport):
    env = dict(SMALL_PATHS, RUSTCCL_TRANSPORT=transport, RUSTCCL_SHM_SMALL_BYTES="1024", RUSTCCL_SHM_SEGMENT_BYTES="4096",
               RUSTCCL_SHM_RING_BYTES="65536")
    results = launch.run(f"w_collectives:{body}", world, env=env, timeout=240)
    failures = [f for _, fs in results for f in fs]
    checked = sum(n for n, _ in results)
    assert checked > 0
    assert not failures, f"{len(failures)} of {checked} checks failed:\n" + "\n".join(failures[:40])


def test_default_thresholds_all_reduce():
    """The shipped thresholds (no overrides) on a 3-rank group."""
    results = launch.run("w_collectives:all_reduce_matrix", 3, timeout=240)
    failures = [f for _, fs in results for f in fs]
    assert not failures, "\n".join(failures[:40])


@pytest.mark.parametrize("world", [2, 3])
def test_premul_sum(world):
    """PREMUL_SUM is scaled in the torch backend, summed by the engine."""
    results = launch.run("w_collectives:premul_sum", world, timeout=240)
    failures = [f for _, fs in results for f in fs]
    assert sum(n for n, _ in results) > 0
    assert not failures, "\n".join(failures[:40])
