"""Probe: how fast one thread copies a buffer through the kernel
(process_vm_readv of its own memory, the path of rustccl's single-copy
transfers without shared tensors) against a plain copy in user space, alone
and with a second process doing the same at once (as a split send or a
2-rank broadcast has both ranks copy half each).

    python benchmarks/kernel_copy_pair_probe.py [MIB]

MIB: buffer size in MiB (default 16). Prints the median time and GB/s of
each case (3 s of back-to-back copies per process).
"""

import ctypes
import multiprocessing as mp
import os
import sys
import time

import torch

libc = ctypes.CDLL(None, use_errno=True)
libc.process_vm_readv.restype = ctypes.c_ssize_t


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def median_copy(kind: str, n: int, seconds: float = 3.0) -> float:
    src, dst = torch.ones(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    local, remote = IoVec(dst.data_ptr(), n), IoVec(src.data_ptr(), n)

    def kernel():
        if libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != n:
            raise OSError(ctypes.get_errno(), "process_vm_readv")

    copy = kernel if kind == "kernel" else (lambda: dst.copy_(src))
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
