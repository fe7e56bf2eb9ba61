"""Probe: how fast one thread copies a buffer through the kernel
(process_vm_readv of its own memory, the path of rustccl's single-copy
transfers without shared tensors) against a plain copy in user space, alone
and with a second process doing the same at once (as a split send or a
2-rank broadcast has both ranks copy half each).

    python benchmarks/kernel_copy_pair_probe.py [MIB]

MIB: buffer size in MiB (default 16). Prints the median time and GB/s of
each case (3 s of back-to-back copies per process).
"""

import multiprocessing as mp
import os
import sys
import time

import torch

from attach_read_probe import kernel_read  # this folder's probe of several readers


def median_copy(kind: str, n: int, seconds: float = 3.0) -> float:
    src, dst = torch.ones(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    if kind == "kernel":
        copy = lambda: kernel_read(os.getpid(), dst.data_ptr(), src.data_ptr(), n)  # noqa: E731
    else:
        copy = lambda: dst.copy_(src)  # noqa: E731
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        copy()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def worker(kind, n, q):
    q.put(median_copy(kind, n))


def main():
    torch.set_num_threads(1)
    n = int(sys.argv[1] if len(sys.argv) > 1 else 16) << 20
    for kind in ("user", "kernel"):
        for procs in (1, 2):
            q = mp.Queue()
            ps = [mp.Process(target=worker, args=(kind, n, q)) for _ in range(procs)]
            for p in ps:
                p.start()
            ts = [q.get() for _ in ps]
            for p in ps:
                p.join()
            t = max(ts)
            print(f"{kind:6s} x{procs}: {n >> 20} MiB in {t * 1e3:.2f} ms ({n / t / 1e9:.1f} GB/s per process)")


if __name__ == "__main__":
    main()
