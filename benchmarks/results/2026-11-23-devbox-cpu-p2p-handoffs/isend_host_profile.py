"""Host time of an 8-byte dist.isend that rustccl completes at once (the
caller writes it into the ring): rank 1 issues 3000 in a row, rank 0 receives;
run with RUSTCCL_HOST_PROFILE=1 under torchrun --nproc_per_node=2. Prints the
Python-level time per isend and rustccl's spans (capi_submit: its C ABI call)."""
import time, torch, torch.distributed as dist, rustccl, os
dist.init_process_group("rustccl")
r = dist.get_rank(); x = torch.ones(2); N = 3000
for rep in range(3):
    dist.barrier()
    if r == 1:
        rustccl._rustccl._host_profile(True)
        t0 = time.perf_counter()
        ws = [dist.isend(x, 0) for _ in range(N)]
        a = (time.perf_counter()-t0)/N*1e6
        for w in ws: w.wait()
        print("isend us", round(a,2), {k: round(ns / max(c, 1) / 1e3, 2) for k, c, ns in rustccl._rustccl._host_profile(True) if c})
    else:
        for i in range(N): dist.recv(x, 1)
    dist.barrier()
dist.destroy_process_group()
