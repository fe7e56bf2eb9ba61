"""Run under torchrun with a /dev/shm too small for every rank's segment
(test_shm_space.py): collectives and sends of up to 4 MiB still give the
right results, over TCP where a rank has no segment."""

import torch
import torch.distributed as dist

import rustccl  # noqa: F401

dist.init_process_group("rustccl")
r, w = dist.get_rank(), dist.get_world_size()
for n in (1 << 8, 1 << 16, 1 << 20):
    x = torch.full((n,), float(r + 1))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((n,), float(w * (w + 1) // 2))), f"all_reduce {n}"
    y = torch.empty(n)
    dist.all_to_all_single(y, torch.arange(n, dtype=torch.float32) + 1000 * r)
    k = n // w
    want = torch.cat([torch.arange(r * k, (r + 1) * k, dtype=torch.float32) + 1000 * s for s in range(w)])
    assert torch.equal(y, want), f"all_to_all {n}"
    z = torch.arange(n, dtype=torch.float32) + r
    if r % 2 == 0:
        dist.send(z, r + 1)
    else:
        dist.recv(z, r - 1)
        assert torch.equal(z, torch.arange(n, dtype=torch.float32) + r - 1), f"send/recv {n}"
dist.barrier()
local = rustccl.stats()["thresholds"].get("local_ranks")
print(f"PASS rank {r} local_ranks={local}", flush=True)
dist.destroy_process_group()
