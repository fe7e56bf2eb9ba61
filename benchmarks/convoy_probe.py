"""Probe: does a run of small collectives fall back to its own pace after
the ranks were pushed apart, or do they stay in a convoy (every rank
asleep in every phase, each phase costing a futex wake-up)?

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=16 benchmarks/convoy_probe.py

Each rank runs 8-byte broadcasts (OP=all_reduce etc. for another op):
CALLS calls unperturbed, then CALLS calls in which rank 0 busy-waits
DELAY_US (150) before each call (every other rank waits that long for it,
longer than a fixed 60 us polling window), then 5 x CALLS unperturbed
again. Rank 0 prints, per block of CALLS, the median time a call took on rank 0
(its own busy wait subtracted while perturbed) / the median over the
ranks of theirs, with RUSTCCL_SHM_WAIT_SPIN_US.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

import rustccl  # noqa: F401  (registers the backend)

CALLS = int(os.environ.get("CALLS", "400"))
DELAY = float(os.environ.get("DELAY_US", "150")) * 1e-6
OP = os.environ.get("OP", "broadcast")


def main():
    dist.init_process_group("rustccl")
    rank = dist.get_rank()
    x = torch.ones(2)
    call = {"broadcast": lambda: dist.broadcast(x, 0), "all_reduce": lambda: dist.all_reduce(x), "barrier": dist.barrier}[OP]
    for _ in range(50):
        call()

    def block(perturbed):
        ts = []
        for _ in range(CALLS):
            t0 = time.perf_counter()
            if perturbed and rank == 0:
                while time.perf_counter() - t0 < DELAY:
                    pass
            t1 = time.perf_counter()
            call()
            ts.append(time.perf_counter() - (t1 if perturbed else t0))
        return statistics.median(ts) * 1e6

    blocks = [("before", block(False)), ("perturbed", block(True))]
    blocks += [(f"after {i + 1}", block(False)) for i in range(5)]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, blocks)
    if rank == 0:
        setting = os.environ.get("RUSTCCL_SHM_WAIT_SPIN_US", "auto")
        # per block: rank 0's median / the median of the ranks' medians
        cells = [f"{k} {v:.1f}/{statistics.median(b[i][1] for b in every):.1f}" for i, (k, v) in enumerate(blocks)]
        print(f"{OP} world {dist.get_world_size()} RUSTCCL_SHM_WAIT_SPIN_US={setting}: " + ", ".join(cells), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
