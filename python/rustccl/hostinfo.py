"""Facts about this host (a machine) that results and tuned tables are
keyed by: its CPU model, memory, NUMA nodes and fingerprint."""

from __future__ import annotations

import hashlib
import os
import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def host_fingerprint() -> str:
    """Twelve hex digits that differ between hosts of another CPU, core
    count, memory size or kernel, and agree between runs on one host."""
    parts = [cpu_model(), str(os.cpu_count()), str(mem_gib()), platform.machine(), platform.release()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def numa_nodes() -> int:
    try:
        return max(1, sum(1 for d in os.listdir("/sys/devices/system/node") if d.startswith("node") and d[4:].isdigit()))
    except OSError:
        return 1
