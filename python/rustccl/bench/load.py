"""Busy processes beside the ranks (``--load N``: N per core, what a CPU
training job's compute looks like to a collective), and their iteration
counters, so that a benchmark under load also reports how fast the load
itself ran beside each system: a backend that wins by taking the cores
from the job's compute does not win."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile

import numpy as np

ENV = "RUSTCCL_BENCH_LOAD"

# A busy process: counts, and publishes its count every 1024 iterations.
_BUSY = """
import sys, numpy as np
c = np.memmap(sys.argv[1], dtype=np.int64, mode="r+", shape=(int(sys.argv[3]),))
i, n = int(sys.argv[2]), 0
while True:
    n += 1
    if n & 0x3ff == 0:
        c[i] = n
"""


@contextlib.contextmanager
def busy(per_core: int):
    """Starts ``per_core`` busy processes per core for the block; yields
    the value of ``ENV`` that tells the ranks where their counters are
    (None without load). The caller passes it on in the ranks' environment."""
    if per_core <= 0:
        yield None
        return
    n = per_core * (os.cpu_count() or 1)
    path = tempfile.NamedTemporaryFile(prefix="bench-load-", dir="/dev/shm", delete=False).name
    np.memmap(path, dtype=np.int64, mode="w+", shape=(n,)).flush()
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY, path, str(i), str(n)]) for i in range(n)]
    try:
        yield f"{path}:{n}"
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        os.unlink(path)


class Counters:
    """The busy processes' iteration counters, from ``ENV`` (none without
    load: ``count()`` is 0 and ``active`` False)."""

    def __init__(self):
        spec = os.environ.get(ENV)
        self.c = None
        if spec:
            path, n = spec.rsplit(":", 1)
            self.c = np.memmap(path, dtype=np.int64, mode="r", shape=(int(n),))

    @property
    def active(self) -> bool:
        return self.c is not None

    def count(self) -> int:
        return int(self.c.sum()) if self.c is not None else 0
