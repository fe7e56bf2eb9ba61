"""One rank of the simulated multi-host job (tests/python/test_multihost.py):
launched by torchrun inside a network namespace per "host"; checks the
links rustccl chose and that its results equal gloo's, and writes what it
saw to $OUT_DIR/rank<r>.json."""

import json
import os

import torch
import torch.distributed as dist

import rustccl

dist.init_process_group("rustccl")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ["LOCAL_WORLD_SIZE"])
gloo = dist.new_group(backend="gloo")
out = {"rank": rank, "checks": []}
for n in (1, 1000, 100_003, 1 << 20):
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
        g = torch.Generator().manual_seed(rank * 1000 + n)
        x = torch.randint(-50, 50, (n,), generator=g).float()
        y = x.clone()
        dist.all_reduce(x, op=op)
        if op == dist.ReduceOp.AVG:
            dist.all_reduce(y, group=gloo)
            y /= world
        else:
            dist.all_reduce(y, op=op, group=gloo)
        out["checks"].append({"n": n, "op": str(op), "equal": bool(torch.allclose(x, y, rtol=1e-6, atol=1e-5))})
b = torch.full((5000,), float(rank))
dist.broadcast(b, src=world - 1)
outs = [torch.empty(3) for _ in range(world)]
dist.all_gather(outs, torch.full((3,), float(rank)))
out["broadcast_ok"] = bool((b == world - 1).all())
out["all_gather_ok"] = all(bool((o == r).all()) for r, o in enumerate(outs))
s = rustccl.stats()
out["transport"] = s["transport"]
out["links"] = s["links"]
out["algorithm"] = s["ops"]["all_reduce"]["algorithm"]
out["local_world"] = local
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
