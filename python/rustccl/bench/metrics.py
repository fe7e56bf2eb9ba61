"""Bandwidth metrics, nccl-tests style (pure functions, no torch.distributed).

These are the definitions of ``/work/shared/anchors/anchor_bench.py`` and
its README, so rows from this CLI and the committed anchors compare 1:1:

* ``count``: elements of the per-rank buffer for a swept size ``size``:
  ``max(size // itemsize, world)``, rounded down to a multiple of ``world``
  (so reduce_scatter / all_to_all chunks are equal).
* ``bytes``: the per-rank buffer, ``count * itemsize``, except all_gather
  and gather, where it is the gathered output (``count * itemsize *
  world``), as in the anchors and nccl-tests.
* ``algbw = bytes / time`` (GB/s, 1e9 bytes).
* ``busbw = algbw * factor`` with factor:

  ==============  ===============  ==========================================
  all_reduce      2(n-1)/n         reduce-scatter + all-gather of the buffer
  all_gather      (n-1)/n          each rank receives n-1 of n chunks
  reduce_scatter  (n-1)/n          each rank sends n-1 of n chunks
  all_to_all      (n-1)/n          as nccl-tests alltoall
  broadcast       1
  reduce          1                as nccl-tests reduce
  gather          (n-1)/n          the root receives n-1 of n chunks
  scatter         (n-1)/n          the root sends n-1 of n chunks
  send_recv       1                one message, one way (see below)
  ==============  ===============  ==========================================

* send_recv: ranks pair up (0<->1, 2<->3, ...; with an odd world the last
  rank idles). Each timed iteration is a ping-pong (even rank sends then
  receives, odd rank receives then sends), and the time per call is half a
  round trip: the one-way time of one ``bytes``-sized message. busbw =
  algbw = bytes / one-way time.
"""

from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "gather", "scatter", "send_recv")


def busbw_factor(op: str, world: int) -> float:
    """nccl-tests bus-bandwidth factor of ``op`` on ``world`` ranks."""
    n = world
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op in ("broadcast", "send_recv", "reduce"):
        return 1.0
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def element_count(size: int, itemsize: int, world: int) -> int:
    """Elements of the per-rank buffer for the swept size (anchor rule)."""
    count = max(size // itemsize, world)
    return count - count % world


def reported_bytes(op: str, count: int, itemsize: int, world: int) -> int:
    """The ``bytes`` field: per-rank buffer, all_gather's whole output."""
    return count * itemsize * (world if op in ("all_gather", "gather") else 1)


def bandwidths(op: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one call of ``seconds`` moving ``nbytes``."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * busbw_factor(op, world)


def memory_traffic(op: str, nbytes: int, world: int) -> int | None:
    """Bytes every rank of one host together must at least read and write
    in memory for one call of ``op`` (``nbytes`` as in the rows), if each
    byte that reaches another rank is copied once, each input of a
    reduction read once, and each rank's own block copied once from its
    input to its output, which the bench's calls pass as separate tensors
    (B = nbytes, n = world):

    ==============  ==================================================
    all_reduce      (3n-1)B: read all n inputs, write the reduced
                    slices, then n-1 ranks read and write each slice
    reduce_scatter  (n+1)B: read all n inputs, write n outputs of B/n
    reduce          (n+1)B: read all n inputs, write the root's output
    broadcast       2(n-1)B: n-1 ranks read the root's B and write it
    all_to_all      2nB: n ranks read and write n blocks of B/n (n-1
                    from peers, their own)
    all_gather      2nB: n ranks read and write n chunks of B/n
    gather          2B: the root reads and writes n chunks of B/n
    scatter         2B: n ranks read and write their chunk of B/n
    ==============  ==================================================

    Until 2026-12-01 the own blocks were left out (2(n-1)B, 2(n-1)B/n):
    bounds in results committed before then are n/(n-1) too high for
    these four ops (2x with 2 ranks, 1.33x with 4, 1.14x with 8).

    None for send_recv (one pair of ranks, not the host's memory)."""
    n, b = world, nbytes
    if n < 2 or op == "send_recv":
        return None
    return {
        "all_reduce": (3 * n - 1) * b,
        "reduce_scatter": (n + 1) * b,
        "reduce": (n + 1) * b,
        "broadcast": 2 * (n - 1) * b,
        "all_to_all": 2 * n * b,
        "all_gather": 2 * n * b,
        "gather": 2 * b,
        "scatter": 2 * b,
    }.get(op)


def footprint(op: str, nbytes: int, world: int) -> int:
    """Bytes of the tensors all ranks of the host pass to one call of
    ``op`` (inputs and outputs, each counted once)."""
    n, b = world, nbytes
    if op in ("all_reduce", "broadcast", "reduce"):
        return n * b
    if op in ("all_gather", "reduce_scatter"):
        return n * b + b  # n outputs (inputs) of B, n inputs (outputs) of B/n
    if op in ("gather", "scatter"):
        return 2 * b  # the root's n chunks of B/n, and n inputs (outputs) of B/n
    return 2 * n * b  # all_to_all, send_recv


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """The swept sizes: min_bytes, min_bytes*factor, ... <= max_bytes."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min-bytes <= max-bytes, got {min_bytes}, {max_bytes}")
    if factor < 2:
        raise ValueError(f"factor must be >= 2, got {factor}")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


# On CPU the timed loop is shortened for big buffers so that one (backend,
# op, size) point moves at most this many bytes: iters = max(3,
# min(iters, CPU_BYTES_BUDGET // bytes)). At the ~1-3 GB/s a 2-core machine
# reaches that is about a second per point; the default sweep (<= 64 MiB
# reported bytes, 20 iters) is never shortened.
CPU_BYTES_BUDGET = 2 << 30
MIN_ITERS = 3
# Calls per timed loop without --iters. Small CPU points take more: 10-20
# calls of ~20 us lasted well under a millisecond, within the timer's and
# the scheduler's noise, and single points moved 2-3x between runs
# (benchmarks/README).
DEFAULT_ITERS = 20
SMALL_BYTES = 64 << 10
SMALL_MIN_ITERS = 100


def effective_iters(device: str, nbytes: int, iters: int | None, warmup: int) -> tuple[int, int]:
    """(iters, warmup) actually run for a point. ``iters`` None (no
    ``--iters``): 20, at least 100 for small CPU points. Then the CPU byte
    budget above; CUDA runs what was asked (nccl-tests style)."""
    if iters is None:
        iters = SMALL_MIN_ITERS if device == "cpu" and nbytes <= SMALL_BYTES else DEFAULT_ITERS
    if device != "cpu" or nbytes * iters <= CPU_BYTES_BUDGET:
        return iters, warmup
    it = max(MIN_ITERS, min(iters, CPU_BYTES_BUDGET // max(nbytes, 1)))
    return it, min(warmup, max(1, it // 4))


def human_bytes(n: int) -> str:
    """8 B, 32 KiB, 1 MiB, 1.5 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n} B"
