"""The fixed cost of one small CPU collective call on a one-rank group: 
torch's own Python and dispatch (the ``fake`` backend of torch's tests, whose
collectives do nothing), rustccl and gloo, 8-byte tensors, median of 5
loops of 3000 calls per op. What a collective on several ranks costs
beyond this is the exchange itself. One process per backend, in turns:

    for b in fake rustccl gloo fake rustccl gloo; do
        OMP_NUM_THREADS=1 python benchmarks/cpu_call_floor.py $b; done
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import rustccl  # noqa: F401  (registers the backend)


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "rustccl"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    else:
        dist.init_process_group(backend, rank=0, world_size=1)
    x = torch.ones(2)
    outs = [torch.empty(2)]
    calls = {
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: dist.all_gather(outs, x),
        "gather": lambda: dist.gather(x, outs, 0),
        "scatter": lambda: dist.scatter(x, [x], 0),
        "barrier": lambda: dist.barrier(),
    }
    res = {}
    for name, fn in calls.items():
        ts = []
        for _ in range(5):
            for _ in range(200):
                fn()
            t0 = time.perf_counter()
            for _ in range(3000):
                fn()
            ts.append((time.perf_counter() - t0) / 3000 * 1e6)
        res[name] = round(statistics.median(ts), 1)
    print(backend, res, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
