import os, sys, time, torch, torch.distributed as dist, rustccl
dist.init_process_group("rustccl")
r = dist.get_rank(); p = r ^ 1
T = os.environ.get("RUSTCCL_TMP_TRACE") is not None
def tr(w, n):
    if T: print(f"TR {time.time_ns()} {r} {w} {n} py", file=sys.stderr, flush=True)
for nb in [int(v) for v in sys.argv[1].split(',')]:
    x = torch.ones(nb // 4)
    def pp():
        if r % 2 == 0:
            tr("py_send", nb); dist.send(x, p); tr("py_send_done", nb); dist.recv(x, p); tr("py_recv_done", nb)
        else:
            tr("py_recv", nb); dist.recv(x, p); tr("py_recv_done", nb); dist.send(x, p); tr("py_send_done", nb)
    for _ in range(int(sys.argv[2])): pp()
    ts = []
    for k in range(5):
        dist.barrier()
        t = time.perf_counter()
        for _ in range(int(sys.argv[3])): pp()
        ts.append((time.perf_counter() - t) / int(sys.argv[3]) / 2 * 1e6)
    if r == 0: print(nb, "one-way us", round(sorted(ts)[2], 1), [round(v) for v in ts], flush=True)
dist.destroy_process_group()
