"""``python -m rustccl.bench --hosts 2 --link 1gbit``: the compression
benchmark on two simulated hosts (needs root).

Makes two network namespaces joined by a veth pair shaped to the link
(:mod:`rustccl.bench.netns`), starts ``--ranks-per-host`` ranks in each
with torchrun's multi-node rendezvous (``--nnodes=2``), runs
:mod:`rustccl.bench.multihost_rank` (all_reduce sweep per codec, then the
DDP toy training per configuration) and deletes the namespaces.
"""

import datetime
import os
import random
import subprocess
import sys

from .netns import NetnsError, available, two_hosts


def run(cfg, extra: list[str]) -> int:
    why = available()
    if why:
        print(f"rustccl.bench --hosts: {why}", file=sys.stderr)
        return 2
    if cfg.hosts != 2:
        print("rustccl.bench --hosts: only 2 hosts (one veth pair) are supported", file=sys.stderr)
        return 2
    import signal

    def _term(signum, frame):  # so that the namespaces are deleted on SIGTERM too
        raise SystemExit(f"rustccl.bench --hosts: signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    name = cfg.name or f"{datetime.date.today().isoformat()}-{cfg.machine}-cpu-2host-{cfg.link}"
    out = os.path.abspath(cfg.out)
    try:
        with two_hosts(cfg.link, prefix=cfg.netns_prefix) as hosts:
            port = str(random.randint(20000, 40000))
            procs = []
            for node, h in enumerate(hosts):
                env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=h.dev, RUSTCCL_BENCH_DEV=h.dev)
                cmd = h.exec([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
                              f"--nproc_per_node={cfg.ranks_per_host}", f"--master_addr={hosts[0].ip}",
                              f"--master_port={port}", "-m", "rustccl.bench.multihost_rank", "--link", cfg.link,
                              "--shaping", h.shaping, "--out", out, "--name", name, "--machine", cfg.machine,
                              "--max-bytes", str(cfg.max_bytes if cfg.max_bytes else 64 << 20), *extra])
                procs.append(subprocess.Popen(cmd, env=env, stdout=None if node == 0 else subprocess.DEVNULL))
            try:
                codes = [p.wait(timeout=cfg.timeout) for p in procs]
            except subprocess.TimeoutExpired:
                print(f"rustccl.bench --hosts: no result within {cfg.timeout:.0f} s", file=sys.stderr)
                return 2
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
    except NetnsError as e:
        print(str(e), file=sys.stderr)
        return 2
    if any(codes):
        print(f"rustccl.bench --hosts: a host failed (exit codes {codes})", file=sys.stderr)
        return 2
    print(f"wrote {os.path.join(out, name)}.jsonl / .md")
    return 0
