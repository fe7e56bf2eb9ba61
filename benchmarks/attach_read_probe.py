"""Probe: how fast several processes read one process's memory at once,
through the kernel (process_vm_readv, what rustccl's single-copy
collectives do by default) and with a plain copy from a shared mapping
(what they do with RUSTCCL_SHM_TENSORS=1), and through the kernel from
memory given transparent huge pages (`kernel_thp`), as a scatter's receivers read
the root's input (each its own block) or a broadcast's read its buffer
(every one the same block).

    python benchmarks/attach_read_probe.py [SIZES] [READERS] [THREADS]

SIZES block sizes in KiB (default 256,1024,2048,8192), READERS reader
processes (default 3,7), THREADS threads per reader (default 1,8). Each
case: every reader's threads read their pieces of the block REPS times
(REPS=20), all readers at once after a barrier; prints the aggregate
GB/s (all bytes read / the slowest reader's time) and the mean time of
one block. Also prints the kernel and its transparent-huge-page mode.
"""

import ctypes
import mmap
import multiprocessing as mp
import os
import sys
import threading
import time

import torch

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def kernel_read(pid, dst_addr, src_addr, n):
    local, remote = IoVec(dst_addr, n), IoVec(src_addr, n)
    got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got != n:
        raise OSError(ctypes.get_errno(), f"process_vm_readv read {got} of {n}")


def reader(k, how, pid, src_addr, shm_path, total, block, same, threads, reps, start, out):
    torch.set_num_threads(1)
    dst = torch.empty(block, dtype=torch.uint8)
    dst.fill_(0)
    off = 0 if same else k * block
    src = None
    if how == "copy":
        src = torch.from_file(shm_path, shared=True, size=total, dtype=torch.uint8)
    piece = -(-block // threads)
    bar = threading.Barrier(threads + 1)
    done = threading.Barrier(threads + 1)

    def work(t):
        lo, hi = t * piece, min(block, (t + 1) * piece)
        bar.wait()
        for _ in range(reps):
            if how != "copy":
                kernel_read(pid, dst.data_ptr() + lo, src_addr + off + lo, hi - lo)
            else:
                dst[lo:hi].copy_(src[off + lo:off + hi])
        done.wait()

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    bar.wait()
    done.wait()
    out.put(time.perf_counter() - t0)
    for t in ts:
        t.join()


KEEP = []


def huge_pages(n):
    """A tensor of n bytes in anonymous memory aligned to 2 MiB and advised
    to take transparent huge pages (MADV_HUGEPAGE)."""
    m = mmap.mmap(-1, n + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    skip = -addr % (2 << 20)
    m.madvise(mmap.MADV_HUGEPAGE, skip, n - n % (2 << 20) if n >= (2 << 20) else n)
    KEEP.append(m)
    return torch.frombuffer(m, dtype=torch.uint8)[skip:skip + n]


def case(how, block, readers, threads, same, reps):
    total = block * (1 if same else readers)
    shm_path = f"/dev/shm/attach_probe_{os.getpid()}"
    if how == "copy":
        with open(shm_path, "wb") as f:
            f.truncate(total)
        src = torch.from_file(shm_path, shared=True, size=total, dtype=torch.uint8)
    elif how == "kernel_thp":
        src = huge_pages(total)
    else:
        src = torch.empty(total, dtype=torch.uint8)
    src.fill_(1)
    if how == "kernel_thp" and block == 2 << 20 and readers == 3 and threads == 1 and not same:
        rollup = open("/proc/self/smaps_rollup").read().split("\n")
        print("source process:", [l.split() for l in rollup if l.startswith("AnonHugePages")], flush=True)
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(readers + 1), ctx.Queue()
    ps = [ctx.Process(target=reader, args=(k, how, os.getpid(), src.data_ptr(), shm_path, total, block, same, threads, reps, start, out)) for k in range(readers)]
    for p in ps:
        p.start()
    start.wait()
    times = [out.get() for _ in ps]
    for p in ps:
        p.join()
    if how == "copy":
        os.unlink(shm_path)
    slowest = max(times)
    return readers * block * reps / slowest / 1e9, slowest / reps * 1e6


def main():
    libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0)
    sizes = [int(s) << 10 for s in (sys.argv[1] if len(sys.argv) > 1 else "256,1024,2048,8192").split(",")]
    readers = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "3,7").split(",")]
    threads = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "1,8").split(",")]
    reps = int(os.environ.get("REPS", "20"))
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    print(f"kernel {os.uname().release}, THP {thp}, cores {os.cpu_count()}")
    print("| how | block KiB | readers | threads | same block | GB/s all | us a block |")
    print("|---|---|---|---|---|---|---|")
    for block in sizes:
        for n in readers:
            for t in threads:
                for same in (False, True):
                    for how in ("kernel", "kernel_thp", "copy"):
                        bw, us = case(how, block, n, t, same, reps)
                        print(f"| {how} | {block >> 10} | {n} | {t} | {same} | {bw:.1f} | {us:.0f} |", flush=True)


if __name__ == "__main__":
    main()
