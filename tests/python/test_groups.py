"""gloo's features on rustccl (monitored_barrier, sparse all_reduce, DDP
with a sparse embedding) and groups made from groups (shrink_group; split
needs CUDA and is in test_cuda.py), and a group's own settings (pg_options)."""

import re

import pytest

import launch

TORCH_TIMEOUT_RE = re.compile(" (Timed out|closed|timeout) ")


def test_monitored_barrier():
    res = launch.run("w_groups:monitored", 3, pg_timeout=30, timeout=150)
    for r in range(3):
        assert res[r]["ok"] is None and res[r]["c10d"] is None, res[r]
        assert res[r]["after_missing"] == 3.0 and res[r]["after_all"] == 3.0, res[r]
        if res[r]["torch_calls_backend"]:
            assert res[r]["torch"] is None, res[r]  # every rank called it: it passes
        else:
            assert "only implemented for GLOO" in res[r]["torch"]["msg"], res[r]
    m0 = res[0]["missing"]
    assert m0["type"] == "DistBackendError" and "Rank 2 failed to pass monitoredBarrier in 1000 ms" in m0["msg"], m0
    assert "rustccl monitored_barrier" in m0["msg"] and TORCH_TIMEOUT_RE.search(m0["msg"]), m0
    m1 = res[1]["missing"]
    assert m1["type"] == "DistBackendError" and "rank 0 reported that rank(s) [2] failed" in m1["msg"], m1
    assert "Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms" in res[0]["all"]["msg"], res[0]["all"]
    # gloo's wording when rank 0's timeout is spent at once
    assert "Rank 0 timed out in monitoredBarrier after 0 ms" in res[0]["zero"]["msg"], res[0]["zero"]
    assert all(res[r]["after_zero"] == 3.0 for r in range(3)), res
    # subgroup [1, 2]: its rank 0 is global rank 1
    assert res[1]["sub_ok"] is None and res[2]["sub_ok"] is None
    assert "Rank 1 failed to pass monitoredBarrier" in res[1]["sub_missing"]["msg"], res[1]["sub_missing"]
    assert res[1]["sub_after"] == 2.0 and res[2]["sub_after"] == 2.0


@pytest.mark.parametrize("world", [2, 3])
def test_sparse_all_reduce_matches_dense_sum_and_gloo(world):
    res = launch.run("w_groups:sparse", world, timeout=150)
    for r in range(world):
        for key in ("2d", "3"):
            got = res[r][key]
            assert got == {"equal_dense": True, "future_equal": True, "coalesced": True, "is_sparse": True,
                           "same_as_gloo": True}, (r, key, got)
        assert "only ReduceOp.SUM" in res[r]["avg_refused"]["msg"], res[r]
        assert res[r]["after"] == float(world)


def test_ddp_sparse_embedding_matches_gloo():
    res = launch.run("w_groups:ddp_sparse", 2, timeout=150)
    for r in res:
        assert r["max_diff"] < 1e-6, r


@pytest.mark.parametrize("abort", [False, True])
def test_shrink_after_a_rank_dies(abort):
    res = launch.run("w_groups:shrink_dead", 4, 3, abort, pg_timeout=30, timeout=150, may_die=[3])
    assert res[3] is None
    for r in range(3):
        got = res[r]
        assert got["first"] is not None and "rustccl" in got["first"]["msg"], got
        assert got["seen"] == [3] and got["stats_ok"], got  # failed_ranks named the dead rank
        # one group's engine threads before and after: the parent's were joined
        assert got["threads"][1] <= got["threads"][0], got
        assert got["shm_left"] == [], got  # segments are unlinked once mapped
        assert (got["new_rank"], got["new_size"], got["default_size"], got["default_rank"]) == (r, 3, 3, r), got
        assert got["is_default"] and got["backend"] == "rustccl", got
        assert got["sum"] == [3.0] * 5 and got["bcast"] == [7.0] * 5 and got["gathered"] == [0.0, 1.0, 2.0], got


def test_shrink_two_to_one():
    # rank 1 dies: rank 0 hosts the store, which torch's shrink_group clones
    res = launch.run("w_groups:shrink_dead", 2, 1, False, pg_timeout=30, timeout=150, may_die=[1])
    got = res[0]
    assert (got["new_rank"], got["new_size"]) == (0, 1), got
    assert got["sum"] == [0.0] * 5 and got["bcast"] == [7.0] * 5 and got["gathered"] == [0.0], got


def test_shrink_with_mismatched_lists_fails_everywhere():
    res = launch.run("w_groups:shrink_mismatch", 4, pg_timeout=6, timeout=150)
    for r in range(3):
        err = res[r]["err"]
        assert err is not None and "rustccl shrink_group" in err["msg"], (r, err)
        assert err["s"] < 6 + 5, (r, err)
    assert "disagree" in res[0]["err"]["msg"] or "disagree" in res[2]["err"]["msg"], res


def test_shrink_subgroup_keeps_default_group():
    res = launch.run("w_groups:shrink_subgroup", 4, timeout=150)
    for r in (0, 1):
        assert res[r]["new_size"] == 2 and res[r]["sub_sum"] == 2.0 and res[r]["world_still"] == 4, res[r]
        assert res[r]["settings"] == {"RUSTCCL_SEGMENT_BYTES": "8K"} and res[r]["segment"] == 8192, res[r]
    for r in range(4):
        assert res[r]["world_sum"] == 4.0, res[r]


@pytest.mark.parametrize("nproc", [4, 2])
def test_training_survives_a_dead_rank_under_torchrun(nproc):
    """examples/train_survive.py: the last rank vanishes at step 3; the
    survivors shrink, rebuild DDP and finish; their final loss equals that of
    a job of the survivors' size started from the state they had."""
    import os
    import sys
    import tempfile

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import shrink_recovery as sr

    state = os.path.join(tempfile.mkdtemp(prefix="rustccl-state-"), "state.pt")
    got = sr.run(nproc, 6, 3, 256, "shrink", ["--fail-rank", str(nproc - 1), "--save-state", state])
    assert (got["first_world"], got["world"], got["recovered_step"]) == (nproc, nproc - 1, 3), got
    assert got["recovery_s"] > 0 and sorted(map(int, got["losses"])) == list(range(6)), got
    ref = sr.run(nproc - 1, 6, 3, 256, "shrink", ["--resume", state])
    assert ref["start"] == 3 and ref["world"] == nproc - 1, ref
    assert abs(ref["final_loss"] - got["final_loss"]) <= 1e-6 * abs(ref["final_loss"]), (got, ref)


def test_a_group_with_its_own_settings():
    world = 2
    res = launch.run("w_groups:group_settings", world, timeout=150)
    for r in range(world):
        got = res[r]
        tcp, default = got["tcp"], got["default"]
        assert tcp["equal"] and default["equal"], got
        # the group's settings are in force in that group only
        assert tcp["settings"] == {"RUSTCCL_TRANSPORT": "tcp", "RUSTCCL_SMALL_ALLREDUCE_BYTES": "1K",
                                   "RUSTCCL_SEGMENT_BYTES": "4096"}, tcp
        assert default["settings"] == {}, default
        assert set(tcp["links"]) == {"", "tcp"} and set(default["links"]) == {"", "shm"}, got
        assert (tcp["small"], tcp["segment"]) == (1024, 4096), tcp
        assert (default["small"], default["segment"]) == (65536, 524288), default
        assert tcp["algorithms"] and not any(a.startswith("shm") for a in tcp["algorithms"]), tcp
        assert all(a.startswith("shm") for a in default["algorithms"]), default
        assert got["slot"] == 3 << 20 and default["slot"] < 3 << 20, got
        e = got["errors"]
        assert e["unknown"]["type"] == "ValueError" and 'unknown setting "RUSTCCL_SHM_SLOT_MIN"' in e["unknown"]["msg"], e
        assert e["unknown"]["msg"].startswith("rustccl pg_options: "), e
        assert "RUSTCCL_FLIGHT_RECORDER_SIZE applies to the whole process" in e["process"]["msg"], e
        assert 'RUSTCCL_SHM_SLOT_MIN_BYTES="lots": not a byte count' in e["value"]["msg"], e
        assert e["type"]["type"] == "TypeError" and "rustccl: pg_options must be a rustccl.Options" in e["type"]["msg"], e
        assert "keep the parent group's settings" in got["split"]["msg"], got
        assert got["after"] == float(world) and got["tcp_after"] == float(world), got
        # rustccl.config(group): the group's own settings over the process's
        c = got["config"]
        assert got["config_keys_equal"], got
        assert c["process"] == c["default"] == {"RUSTCCL_TRANSPORT": "auto", "RUSTCCL_SEGMENT_BYTES": "524288",
                                                "RUSTCCL_SHM_SLOT_MIN_BYTES": "auto",
                                                "RUSTCCL_FLIGHT_RECORDER_SIZE": "2000"}, c
        assert c["tcp"] == dict(c["process"], RUSTCCL_TRANSPORT="tcp", RUSTCCL_SEGMENT_BYTES="4096"), c
        assert c["slot"] == dict(c["process"], RUSTCCL_SHM_SLOT_MIN_BYTES=str(3 << 20)), c


def test_ranks_with_different_settings_are_warned():
    """The rendezvous compares the ranks' settings: each rank warns of the
    one that differs (its value here and on the peer), not of a setting a
    rank may hold alone; the groups work where their paths agree."""
    world = 2
    res = launch.run("w_groups:settings_differ", world, timeout=120)
    for r in range(world):
        got, peer = res[r], 1 - r
        assert len(got["differ"]) == 1, got
        w = got["differ"][0]
        assert w.startswith("rustccl group '") and f"rank {r}: its settings differ from rank {peer}'s: " in w, w
        assert f"RUSTCCL_SMALL_BROADCAST_BYTES={(r + 1) * 1024} here, {(peer + 1) * 1024} on rank {peer}." in w, w
        assert "wait for each other until the timeout" in w, w
        assert got["local"] == [], got
        assert got["sums"] == [float(world), float(world)], got

