"""One rank of a two-host TLS job (tests/python/test_tls.py), started in a
network namespace per host with RANK / WORLD_SIZE / MASTER_* set. TLS comes
from the environment, or with TLS_VIA=options from pg_options. Checks
all_reduce against gloo, a 4 MiB send / recv, and that a new_group's links
are encrypted too; writes what it saw, or the error, to $OUT_FILE."""

import json
import os
import traceback

import torch
import torch.distributed as dist

import rustccl

out = {"rank": int(os.environ["RANK"])}
try:
    options = None
    if os.environ.get("TLS_VIA") == "options":
        options = rustccl.Options(RUSTCCL_TLS=1, RUSTCCL_TLS_SECRET_FILE=os.environ["SECRET"])
    dist.init_process_group("rustccl", pg_options=options)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    checks = []
    for n in (1, 1000, 1 << 20, 8 << 20):
        g = torch.Generator().manual_seed(rank * 1000 + n)
        x = torch.randint(-50, 50, (n,), generator=g).float()
        y = x.clone()
        dist.all_reduce(x)
        dist.all_reduce(y, group=gloo)
        checks.append(bool(torch.equal(x, y)))
    out["all_reduce_equal"] = checks
    big = torch.full((1 << 20,), float(rank))
    got = torch.empty(1 << 20)
    peer = 1 - rank
    reqs = [dist.isend(big, peer), dist.irecv(got, peer)]
    for r in reqs:
        r.wait()
    out["send_recv_ok"] = bool((got == peer).all())
    out["links"] = rustccl.stats()["links"]
    sub = dist.new_group([0, 1])
    z = torch.ones(10)
    dist.all_reduce(z, group=sub)
    out["new_group_ok"] = bool((z == 2).all())
    out["new_group_links"] = rustccl.stats(sub)["links"]
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - the test reads the message
    out["error"] = f"{type(e).__name__}: {e}"
    out["trace"] = traceback.format_exc()[-2000:]
with open(os.environ["OUT_FILE"], "w") as f:
    json.dump(out, f)
