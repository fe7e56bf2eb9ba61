# Small-op latency breakdown: per op, rank 0's Python time per call (rustccl and gloo alternately),
# and per rank the engine's own time per call (stats avg_us) and who ran it (by_caller), algorithm.
import os, sys, time, statistics, json
import torch, torch.distributed as dist
import rustccl
import torch.testing._internal.distributed.fake_pg  # registers "fake"
dist.init_process_group("rustccl")
r, n = dist.get_rank(), dist.get_world_size()
gl = dist.new_group(backend="gloo")
rc = dist.new_group(backend="rustccl")
fk = dist.new_group(backend="fake")
N = int(os.environ.get("N", "400"))
if r == 0:
    dist.barrier(group=rc); print("thresholds", rustccl.stats(rc)["thresholds"]); sys.stdout.flush()
else:
    dist.barrier(group=rc)
def mk(op, g):
    x = torch.ones(8); out = [torch.empty(8) for _ in range(n)]
    a2o = torch.empty(8 * n); a2i = torch.ones(8 * n)
    if op == "all_reduce": return lambda: dist.all_reduce(x, group=g)
    if op == "broadcast": return lambda: dist.broadcast(x, 0, group=g)
    if op == "barrier": return lambda: dist.barrier(group=g)
    if op == "scatter": return lambda: dist.scatter(x, out if r == 0 else None, src=0, group=g)
    if op == "gather": return lambda: dist.gather(x, out if r == 0 else None, dst=0, group=g)
    if op == "all_to_all": return lambda: dist.all_to_all_single(a2o, a2i, group=g)
    if op == "all_gather": return lambda: dist.all_gather_into_tensor(a2o, x, group=g)
    if op == "reduce": return lambda: dist.reduce(x, 0, group=g)
    if op == "send_recv":
        p = r ^ 1
        if p >= n: return lambda: None
        if r % 2 == 0:
            def f(): dist.send(x, p, group=g); dist.recv(x, p, group=g)
        else:
            def f(): dist.recv(x, p, group=g); dist.send(x, p, group=g)
        return f
ops = sys.argv[1].split(",")
res = {}
for op in ops:
    fr, fg, ff = mk(op, rc), mk(op, gl), mk(op, fk)
    for _ in range(50): fr(); fg(); ff()
    rustccl.reset_stats(rc)
    tr, tg, tf = [], [], []
    for rep in range(5):
        for f, acc in ((fr, tr), (fg, tg), (ff, tf)):
            dist.barrier(group=gl)
            t0 = time.perf_counter()
            for _ in range(N): f()
            acc.append((time.perf_counter() - t0) / N * 1e6)
    s = rustccl.stats(rc)["ops"]
    key = {"send_recv": "send"}.get(op, op)
    st = s.get(key, {}) if key != "all_gather" else s.get("all_gather", s.get("all_gather_into_tensor", {}))
    eng = {k: st.get(k) for k in ("calls", "avg_us", "by_caller", "algorithm")}
    if op == "send_recv": eng["recv"] = {k: s.get("recv", {}).get(k) for k in ("calls", "avg_us", "by_caller", "algorithm")}
    mine = dict(fake_us=round(statistics.median(tf), 1), rustccl_us=round(statistics.median(tr), 1), gloo_us=round(statistics.median(tg), 1), engine=eng)
    allr = [None] * n
    dist.all_gather_object(allr, mine, group=gl)
    if r == 0:
        print(op, "rank0 rustccl %.1f us gloo %.1f us ratio %.1f fake %.1f us" % (mine["rustccl_us"], mine["gloo_us"], mine["gloo_us"] / mine["rustccl_us"], mine["fake_us"]))
        for i, m in enumerate(allr):
            print("   r%d py %.1f fake %.1f eng %s" % (i, m["rustccl_us"], m["fake_us"], m["engine"]))
        sys.stdout.flush()
import glob
if r == 0:
    for st in glob.glob("/proc/self/task/*/status"):
        d = dict(l.split(":\t", 1) for l in open(st).read().splitlines() if ":\t" in l)
        if "rustccl" in d["Name"] or d["Name"].startswith("python"):
            print("ctxt", d["Name"].strip(), "vol", d["voluntary_ctxt_switches"].strip(), "invol", d["nonvoluntary_ctxt_switches"].strip())
dist.destroy_process_group()
