"""Two "hosts" on this machine, each a network namespace of its own joined
by a veth pair, 2 ranks per host, launched with torchrun's multi-node
rendezvous: TCP must carry the traffic between hosts and shared memory the
traffic within a host, with results equal to gloo's. Needs root (ip netns);
skipped with the reason otherwise."""

import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

from rustccl.bench import netns

import launch

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def two_hosts():
    """Two namespaces joined by an unshaped veth pair (rustccl.bench.netns,
    which the compression benchmark also uses), deleted afterwards."""
    why = netns.available()
    if why:
        pytest.skip(why)
    with netns.two_hosts("none", prefix=os.environ.get("RUSTCCL_NETNS_PREFIX", "rcmh")) as hosts:
        yield [(h.ns, h.dev, h.ip) for h in hosts]


def test_two_hosts_two_ranks_each(two_hosts):
    (a, va, ip_a), (b, vb, ip_b) = two_hosts
    out_dir = tempfile.mkdtemp(prefix="rustccl-mh-")
    port = str(random.randint(20000, 40000))
    procs = []
    for node, (ns, dev) in enumerate([(a, va), (b, vb)]):
        env = dict(os.environ, OUT_DIR=out_dir, GLOO_SOCKET_IFNAME=dev, OMP_NUM_THREADS="1", PYTHONPATH=HERE)
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               f"--node_rank={node}", "--nproc_per_node=2", f"--master_addr={ip_a}", f"--master_port={port}",
               os.path.join(HERE, "multihost_job.py")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = launch.communicate_all(procs, 240, "the two-host job")
    assert all(p.returncode == 0 for p in procs), "\n----\n".join(log[-3000:] for log in logs)
    for r in range(4):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            res = json.load(f)
        assert res["transport"] == "shm+tcp", res
        node = r // 2
        for p, kind in enumerate(res["links"]):
            if p != r:
                assert kind == ("shm" if p // 2 == node else "tcp"), (r, res["links"])
        assert all(c["equal"] for c in res["checks"]), res["checks"]
        assert res["broadcast_ok"] and res["all_gather_ok"], res
        assert res["algorithm"] == "hierarchical", res
