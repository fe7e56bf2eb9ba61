# Aggregate copy bandwidth of the host: k processes, each copying a 64 MiB tensor (and a 1 MiB one: cache-resident) in a loop, at once.
import sys, time, torch, multiprocessing as mp
def worker(nbytes, iters, bar, q):
    torch.set_num_threads(1)
    a = torch.ones(nbytes // 4); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    bar.wait(); t0 = time.perf_counter()
    for _ in range(iters): b.copy_(a)
    q.put((time.perf_counter() - t0, nbytes * iters))
if __name__ == "__main__":
    mp.set_start_method("spawn")
    for nbytes, iters in ((64 << 20, 20), (1 << 20, 2000), (256 << 10, 8000)):
        for k in [int(x) for x in sys.argv[1].split(",")]:
            bar = mp.Barrier(k); q = mp.Queue()
            ps = [mp.Process(target=worker, args=(nbytes, iters, bar, q)) for _ in range(k)]
            for p in ps: p.start()
            res = [q.get() for _ in ps]
            for p in ps: p.join()
            t = max(r[0] for r in res); tot = sum(r[1] for r in res)
            print(f"copy {nbytes>>10} KiB x{k} procs: aggregate {tot/t/1e9:.1f} GB/s copied ({2*tot/t/1e9:.1f} GB/s read+write), per proc {tot/t/k/1e9:.2f}", flush=True)
