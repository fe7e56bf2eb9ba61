"""torchft's DiLoCo between two simulated hosts on a slow link: its outer
synchronisation over rustccl, exact and int8-compressed, against torchft's
gloo group.

    python benchmarks/diloco_slow_link.py --link 1gbit --rounds 2 --out benchmarks/results/devbox-2core/diloco-1gbit

Two network namespaces joined by a veth pair shaped to ``--link``
(``rustccl.bench.netns``), one DiLoCo replica in each and torchft's
Lighthouse beside replica 0. Each replica trains the same MLP (3 x
Linear(1024, 1024)) on its own batches of a fixed teacher's regression
task, AdamW inside, Nesterov SGD outside, synchronising every
``--sync-every`` steps for ``--outer-steps`` outer steps. Per variant and
round: wall time per outer step (median over the run), bytes sent on the
link (both ends' veth counters), and the final loss on a fixed evaluation
set. torchft's own quantized outer all-reduce needs Triton and a GPU, so it
does not run here.
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
from datetime import timedelta
from pathlib import Path

VARIANTS = ("rustccl", "rustccl-int8", "gloo")
WIDTH = 1024


def _net(seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def replica_main() -> None:
    import torch
    from torch import nn
    from torchft import Manager
    from torchft.local_sgd import DiLoCo
    from torchft.process_group import ProcessGroupGloo

    from rustccl.torchft import ProcessGroupRustccl

    rid, variant, ip = int(os.environ["REPLICA"]), os.environ["VARIANT"], os.environ["MY_IP"]
    sync_every, outer = int(os.environ["SYNC_EVERY"]), int(os.environ["OUTER_STEPS"])
    timeout = timedelta(seconds=60)
    if variant == "gloo":
        pg = ProcessGroupGloo(timeout=timeout)
    else:
        pg = ProcessGroupRustccl(timeout=timeout, compression="int8" if variant.endswith("int8") else None)
    store = torch.distributed.TCPStore(ip, 0, is_master=True, wait_for_workers=False)
    model, teacher = _net(0), _net(1)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-4)
    outer_opt = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    manager = Manager(
        pg=pg, min_replica_size=2, use_async_quorum=False, replica_id=f"diloco_{rid}",
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        store_addr=ip, store_port=store.port, rank=0, world_size=1, hostname=ip,
        lighthouse_addr=os.environ["LIGHTHOUSE"], timeout=timeout, quorum_timeout=timeout,
        # both start from the same seeded weights: no heal at step 0 (its HTTP
        # transport names the host by its hostname, which the namespaces share)
        init_sync=False,
    )
    g = torch.Generator().manual_seed(100 + rid)
    ev = torch.Generator().manual_seed(7)
    x_eval = torch.randn(512, WIDTH, generator=ev)
    with torch.no_grad():
        y_eval = teacher(x_eval)
    dev = os.environ["DEV"]
    tx = Path(f"/sys/class/net/{dev}/statistics/tx_bytes")
    step_times, sync_times, tx0 = [], [], int(tx.read_text())
    last = None
    with DiLoCo(manager, [model], inner, outer_opt, sync_every=sync_every) as _:
        while manager.current_step() < outer:
            x = torch.randn(64, WIDTH, generator=g)
            with torch.no_grad():
                y = teacher(x)
            loss = nn.functional.mse_loss(model(x), y)
            inner.zero_grad()
            loss.backward()
            step = manager.current_step()
            t0 = time.perf_counter()
            inner.step()  # every sync_every-th one synchronises
            if manager.current_step() != step:
                now = time.perf_counter()
                sync_times.append(now - t0)
                if last is not None:
                    step_times.append(now - last)
                last = now
    sent = int(tx.read_text()) - tx0
    with torch.no_grad():
        final = nn.functional.mse_loss(model(x_eval), y_eval).item()
    Path(os.environ["OUT_FILE"]).write_text(json.dumps({"step_s": step_times, "sync_s": sync_times, "sent": sent, "loss": final}))
    manager.shutdown(wait=False)


def run_variant(hosts, variant: str, args, d: Path) -> dict:
    port = random.randint(20000, 40000)
    lh = subprocess.Popen(["ip", "netns", "exec", hosts[0].ns, str(Path(sys.executable).parent / "torchft_lighthouse"),
                           "--min_replicas", "2", "--quorum_tick_ms", "50", "--join_timeout_ms", "10000",
                           "--bind", f"[::]:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = []
    try:
        time.sleep(0.5)
        for r, h in enumerate(hosts):
            env = {k: v for k, v in os.environ.items() if not k.startswith("RUSTCCL_")}
            env.update(REPLICA=str(r), VARIANT=variant, MY_IP=h.ip, DEV=h.dev, LIGHTHOUSE=f"http://{hosts[0].ip}:{port}",
                       SYNC_EVERY=str(args.sync_every), OUTER_STEPS=str(args.outer_steps), OMP_NUM_THREADS="1",
                       OUT_FILE=str(d / f"{variant}-{r}.json"), DILOCO_REPLICA="1", GLOO_SOCKET_IFNAME=h.dev)
            log = open(d / f"{variant}-{r}.log", "wb")
            procs.append(subprocess.Popen(["ip", "netns", "exec", h.ns, sys.executable, __file__], env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
        for r, p in enumerate(procs):
            if p.wait(timeout=1200) != 0:
                tail = (d / f"{variant}-{r}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"diloco_slow_link: replica {r} of {variant} failed:\n{tail}")
    finally:
        for p in procs:
            p.kill()
        lh.kill()
        lh.wait()
    res = [json.loads((d / f"{variant}-{r}.json").read_text()) for r in range(2)]
    steps = [s for x in res for s in x["step_s"]]
    syncs = [s for x in res for s in x["sync_s"]]
    return {"variant": variant, "outer_step_s": statistics.median(steps), "sync_s": statistics.median(syncs),
            "link_bytes": sum(x["sent"] for x in res),
            "loss": statistics.mean(x["loss"] for x in res), "losses": [x["loss"] for x in res]}


def report(rows: list[dict], args, shaping: str) -> str:
    out = [f"# DiLoCo over a {args.link} link: outer synchronisation through rustccl vs torchft's gloo ({args.machine})",
           "", f"`python benchmarks/diloco_slow_link.py --link {args.link}`: two network namespaces ({shaping}),",
           f"one replica each; MLP 3 x Linear({WIDTH}, {WIDTH}) ({3 * (WIDTH * WIDTH + WIDTH) * 4 / 1e6:.1f} MB of float32 "
           f"parameters), sync every {args.sync_every} steps, {args.outer_steps} outer steps; variants in turn, "
           f"{args.rounds} rounds; median (min-max).", "",
           "The outer synchronisation is the inner step that runs it (quorum, all-reduce of the pseudo-gradients,",
           "outer optimizer step).", "",
           "| outer all-reduce | time per outer step (s) | outer synchronisation (s) | bytes on the link (MB) "
           "| final eval loss |", "|---|---|---|---|---|"]
    for v in VARIANTS:
        rs = [r for r in rows if r["variant"] == v]

        def cell(key, scale=1.0, fmt=".3f"):
            xs = sorted(r[key] * scale for r in rs)
            return f"{statistics.median(xs):{fmt}} ({xs[0]:{fmt}}-{xs[-1]:{fmt}})"

        name = {"rustccl": "rustccl, exact", "rustccl-int8": "rustccl, int8 between hosts", "gloo": "torchft's gloo"}[v]
        out.append(f"| {name} | {cell('outer_step_s')} | {cell('sync_s')} | {cell('link_bytes', 1e-6, '.1f')} "
                   f"| {cell('loss', 1, '.6f')} |")
    out += ["", "torchft's quantized outer all-reduce (`should_quantize=True`) needs Triton and CUDA tensors: not run on CPU.", ""]
    return "\n".join(out)


def main() -> None:
    if os.environ.get("DILOCO_REPLICA"):
        return replica_main()
    from rustccl.bench import netns

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--link", default="1gbit")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sync-every", type=int, default=20)
    ap.add_argument("--outer-steps", type=int, default=6)
    ap.add_argument("--machine", default=os.uname().nodename)
    ap.add_argument("--out", required=True, help="path without suffix")
    args = ap.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(f"diloco_slow_link: {why}")
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("DILOCO_KEEP")) as d, netns.two_hosts(args.link, prefix="rcdl") as hosts:
        for i in range(args.rounds):
            for v in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
                rows.append(dict(run_variant(hosts, v, args, Path(d)), round=i, link=args.link, machine=args.machine))
                print(rows[-1], flush=True)
        shaping = hosts[0].shaping
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = report(rows, args, shaping)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
