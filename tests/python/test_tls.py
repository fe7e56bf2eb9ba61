"""TLS between two "hosts" (network namespaces joined by a veth pair), one
rank each, as real processes: an encrypted group whose results equal
gloo's and whose new_group is encrypted too (TLS from the environment, or
from pg_options), and the peers that must not get in (another secret, a
rank without TLS) failing both ranks, soon, with errors that name the
cause. Needs root (ip netns); skipped with the reason otherwise."""

import json
import os
import random
import subprocess
import sys
import time

import pytest

from rustccl.bench import netns

import launch

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def two_hosts():
    why = netns.available()
    if why:
        pytest.skip(why)
    with netns.two_hosts("none", prefix=os.environ.get("RUSTCCL_NETNS_PREFIX", "rctls")) as hosts:
        yield [(h.ns, h.dev, h.ip) for h in hosts]


def _secret(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode())
    return str(path)


def _run(two_hosts, tmp_path, env_of):
    """Rank r in host r's namespace with env_of(r) over the environment;
    each rank's JSON result (or error) and how long the job took."""
    (_, _, ip_a), _ = two_hosts
    port = str(random.randint(20000, 40000))
    procs = []
    t0 = time.monotonic()
    for r, (ns, dev, _) in enumerate(two_hosts):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUSTCCL_")}
        env.update(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR=ip_a, MASTER_PORT=port, GLOO_SOCKET_IFNAME=dev,
                   OMP_NUM_THREADS="1", OUT_FILE=str(tmp_path / f"rank{r}.json"))
        env.update(env_of(r))
        cmd = ["ip", "netns", "exec", ns, sys.executable, os.path.join(HERE, "tls_job.py")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = launch.communicate_all(procs, 120, "a TLS job")
    took = time.monotonic() - t0
    results = []
    for r in range(2):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), logs[r][-3000:]
        results.append(json.loads(path.read_text()))
    return results, took


@pytest.mark.parametrize("via", ["env", "options"])
def test_an_encrypted_group_between_hosts_equals_gloo_and_its_new_groups_are_encrypted(two_hosts, tmp_path, via):
    secret = _secret(tmp_path, "secret", "the job's secret, 32 bytes......")
    if via == "env":
        def env_of(r):
            return {"RUSTCCL_TLS": "1", "RUSTCCL_TLS_SECRET_FILE": secret}
    else:
        def env_of(r):
            return {"TLS_VIA": "options", "SECRET": secret}
    results, _ = _run(two_hosts, tmp_path, env_of)
    for res in results:
        assert "error" not in res, res.get("trace", res)
        assert all(res["all_reduce_equal"]), res
        assert res["send_recv_ok"] and res["new_group_ok"], res
        peer = 1 - res["rank"]
        assert res["links"][peer] == "tls" and res["new_group_links"][peer] == "tls", res


def test_a_rank_with_another_secret_fails_both_ranks_with_the_cause(two_hosts, tmp_path):
    good = _secret(tmp_path, "good", "the job's secret, 32 bytes......")
    bad = _secret(tmp_path, "bad", "someone else's secret, 32 bytes.")
    results, took = _run(two_hosts, tmp_path, lambda r: {"RUSTCCL_TLS": "1", "RUSTCCL_TLS_SECRET_FILE": bad if r else good})
    for res in results:
        assert "rustccl" in res.get("error", "") and "TLS with rank" in res["error"], res
    assert took < 60, f"the ranks took {took:.0f} s to fail"


def test_a_rank_without_tls_among_tls_ranks_fails_both_before_any_data(two_hosts, tmp_path):
    secret = _secret(tmp_path, "secret", "the job's secret, 32 bytes......")
    results, took = _run(two_hosts, tmp_path, lambda r: {} if r else {"RUSTCCL_TLS": "1", "RUSTCCL_TLS_SECRET_FILE": secret})
    for res in results:
        err = res.get("error", "")
        assert "rustccl" in err and "TLS" in err and "set RUSTCCL_TLS the same on every rank" in err, res
    assert took < 60, f"the ranks took {took:.0f} s to fail"
