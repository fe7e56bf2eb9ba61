"""TLS against plain TCP between two simulated hosts, in the same processes.

    python benchmarks/tls_speed.py --links 1gbit,10gbit --rounds 5 --out benchmarks/results/devbox-2core/tls

Two network namespaces joined by a veth pair shaped to each of ``--links`` in turn
(``rustccl.bench.netns``), one rank in each. Every rank makes four groups
over the same two processes: plain, TLS (a shared-secret file), and each
with the int8 compression between hosts (``rustccl.set_compression``:
compress, then encrypt). Round by round, alternating the groups, it times a
32 MiB all_reduce and a 32 MiB send / recv each way, and the process CPU
time each took: the CPU time TLS adds over plain is the cipher's (both
ends encrypt and decrypt on the same cores on a small machine). Median and
spread over ``--rounds``. Writes ``OUT.jsonl`` (a header, one results-schema
row per link, op and group, then every round's row) and ``OUT.md`` (a table
per link).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20
VARIANTS = ("plain", "tls", "plain+int8", "tls+int8")


def rank_main() -> None:
    import torch
    import torch.distributed as dist

    import rustccl

    rounds, size = int(os.environ["ROUNDS"]), int(os.environ["BYTES"])
    dist.init_process_group("rustccl")
    rank = dist.get_rank()
    tls = rustccl.Options(RUSTCCL_TLS=1, RUSTCCL_TLS_SECRET_FILE=os.environ["SECRET"])
    groups = {
        "plain": dist.group.WORLD,
        "tls": dist.new_group([0, 1], pg_options=tls),
        "plain+int8": dist.new_group([0, 1]),
        "tls+int8": dist.new_group([0, 1], pg_options=tls),
    }
    for name in ("plain+int8", "tls+int8"):
        rustccl.set_compression(groups[name], "int8")
    x = torch.randn(size // 4)
    rows = []

    def timed(fn):
        dist.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - w0, time.process_time() - c0

    for rnd in range(rounds + 1):  # round 0 warms up
        order = VARIANTS if rnd % 2 else VARIANTS[::-1]
        for v in order:
            g = groups[v]
            y = x.clone()
            wall, cpu = timed(lambda: dist.all_reduce(y, group=g))
            if rnd:
                rows.append({"variant": v, "op": "all_reduce", "round": rnd, "s": wall, "cpu_s": cpu})
            if v.endswith("int8"):
                continue  # compression applies to all_reduce only

            def sendrecv():
                for src in (0, 1):
                    if rank == src:
                        dist.send(x, 1 - src, group=g)
                    else:
                        dist.recv(y, src, group=g)

            wall, cpu = timed(sendrecv)
            if rnd:
                rows.append({"variant": v, "op": "send_recv", "round": rnd, "s": wall / 2, "cpu_s": cpu / 2})
    links = {v: rustccl.stats(g)["links"][1 - rank] for v, g in groups.items()}
    if rank == 0:
        Path(os.environ["OUT_FILE"]).write_text(json.dumps({"rows": rows, "links": links}))
    dist.destroy_process_group()


def run(link: str, rounds: int, size: int) -> tuple[dict, str]:
    from rustccl.bench import netns

    why = netns.available()
    if why:
        raise SystemExit(f"tls_speed: {why}")
    with tempfile.TemporaryDirectory() as d, netns.two_hosts(link, prefix="rctlsb") as hosts:
        secret = Path(d) / "secret"
        secret.write_bytes(os.urandom(32))
        out = Path(d) / "out.json"
        port = str(random.randint(20000, 40000))
        procs = []
        for r, h in enumerate(hosts):
            env = {k: v for k, v in os.environ.items() if not k.startswith("RUSTCCL_")}
            env.update(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR=hosts[0].ip, MASTER_PORT=port, OMP_NUM_THREADS="1",
                       ROUNDS=str(rounds), BYTES=str(size), SECRET=str(secret), OUT_FILE=str(out), TLS_SPEED_RANK="1")
            cmd = ["ip", "netns", "exec", h.ns, sys.executable, __file__]
            procs.append(subprocess.Popen(cmd, env=env))
        for p in procs:
            if p.wait(timeout=1800) != 0:
                raise SystemExit("tls_speed: a rank failed")
        return json.loads(out.read_text()), hosts[0].shaping


def summary_rows(rounds: list[dict], link: str, size: int) -> list[dict]:
    """One results-schema row per (op, group) of a link: the time per call
    over the rounds (``backend`` rustccl:GROUP; ``link`` names the link)."""
    out = []
    for op in ("all_reduce", "send_recv"):
        for v in VARIANTS:
            rs = [r for r in rounds if r["op"] == op and r["variant"] == v]
            if not rs:
                continue
            us = sorted(r["s"] * 1e6 for r in rs)
            out.append({"kind": "result", "op": op, "bytes": size, "dtype": "float32", "world": 2,
                        "backend": f"rustccl:{v}", "link": link, "us": statistics.median(us), "us_min": us[0],
                        "us_max": us[-1], "cpu_us": statistics.median(r["cpu_s"] * 1e6 for r in rs),
                        "repeats": len(rs), "method": "ab"})
    return out


def report(res: dict, link: str, shaping: str, size: int, machine: str) -> str:
    out = [f"# TLS against plain TCP, {link} link ({machine})", "",
           f"`python benchmarks/tls_speed.py --links {link}`: two network namespaces ({shaping}), one rank in",
           f"each; {size // MIB} MiB, the four groups alternating round by round in the same processes; median",
           "(min-max) over the rounds. Throughput is the payload over the wall time (all_reduce: the input's",
           "bytes per call); CPU is the process CPU time per call on rank 0. Links: "
           + ", ".join(f"{v} {k}" for v, k in res["links"].items()) + ".", "",
           "| op | group | time (ms) | throughput (MB/s) | speed vs the same group without TLS | CPU (ms) |", "|---|---|---|---|---|---|"]
    med = {}
    for r in summary_rows(res["rows"], link, size):
        op, v = r["op"], r["backend"].removeprefix("rustccl:")
        med[op, v] = r["us"]
        base = med.get((op, v.replace("tls", "plain"))) if v.startswith("tls") else None
        ratio = f"{base / r['us']:.2f}" if base else "-"
        out.append(f"| {op} | {v} | {r['us'] / 1e3:.1f} ({r['us_min'] / 1e3:.1f}-{r['us_max'] / 1e3:.1f}) | "
                   f"{size / r['us']:.0f} | {ratio} | {r['cpu_us'] / 1e3:.1f} |")
    out.append("")
    return "\n".join(out)


def main() -> None:
    if os.environ.get("TLS_SPEED_RANK"):
        return rank_main()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--links", default="1gbit", help="comma-separated: 1gbit, 10gbit, 25gbit, none")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bytes", type=int, default=32 * MIB)
    ap.add_argument("--machine", default=os.uname().nodename)
    ap.add_argument("--out", required=True, help="path without suffix")
    args = ap.parse_args()
    rows, results, mds = [], [], []
    for link in args.links.split(","):
        res, shaping = run(link, args.rounds, args.bytes)
        rows += [dict(r, kind="round", link=link, machine=args.machine) for r in res["rows"]]
        results += summary_rows(res["rows"], link, args.bytes)
        mds.append(report(res, link, shaping, args.bytes, args.machine))
    from rustccl.bench import schema

    results = schema.stamp(results, backends=[f"rustccl:{v}" for v in VARIANTS], machine=args.machine,
                           commit=schema.git_commit())
    head = {"kind": "header", "machine": args.machine, "host_fingerprint": schema.host_fingerprint(),
            "links": args.links, "rounds": args.rounds, "bytes": args.bytes,
            "command": "python benchmarks/tls_speed.py " + " ".join(sys.argv[1:])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in [head, *results, *rows]))
    md = "\n".join(mds)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
