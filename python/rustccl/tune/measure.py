"""Timing the candidates of each tuned rule on this host.

Every rank of a group on one host calls :func:`tune_group` with the same
store. Each candidate setting gets a communicator of its own (a group's
own settings, as ``rustccl.Options`` gives one), so all candidates run in
the same processes on the same arrays, alternately: round by round,
every candidate times its calls once, in an order that rotates, and a
candidate's time per call is the median of its rounds on rank 0. The
rules run as two communicators and count as the faster of the two: one
communicator can run slower than another of the same settings for its
whole life.

The rules are tuned one after another, each with the choices before it
in force. Of the candidates slower on none of the cells the rule decides
by more than ``NOISE``, the fastest (geometric mean) replaces the rule
where its mean is at most ``WIN``. The chosen table is then timed once more
against the rules on every cell, in fresh rounds; a rule whose cell came
out slower than ``1 / FLOOR`` of the rules' time goes back to the rule,
so that the table kept is never slower than the rules where it was
measured.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..bench.arrays import Buffers, communicator_call
from . import new_table, save

WIN = 0.95
NOISE = 1.05
FLOOR = 0.95
KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Rule:
    """A setting the rules choose, its candidates, and the calls it decides
    (op, bytes per rank)."""
    name: str
    candidates: tuple[str, ...]
    cells: tuple[tuple[str, int], ...]


def rules(local_ranks: int, cores: int) -> list[Rule]:
    """The rules tuned for `local_ranks` ranks on a host of `cores`:
    those that choose an algorithm or a layout (every rank must agree on
    them), for the sizes where the choice changes the time."""
    # the largest size per rank keeps an all_gather's output within 64 MiB
    top = max(1 * MiB, min(16 * MiB, (64 * MiB // max(1, local_ranks)) // MiB * MiB))
    big = tuple(sorted({256 * KiB, 1 * MiB, min(4 * MiB, top), top}))
    out = [
        # The small slots also bound the one-step all_gather, scatter and
        # the blocks of all_to_all that skip the input slots: a slot that
        # speeds the all-reduce must not push those off their one step.
        Rule("RUSTCCL_SHM_SMALL_BYTES", ("4096", "16384", "65536", "262144"),
             tuple(("all_reduce", b) for b in (1 * KiB, 8 * KiB, 32 * KiB, 128 * KiB))
             + tuple((op, 1 * KiB) for op in ("all_gather", "scatter", "all_to_all"))),
        # One rule per collective: where reads pay differs from op to op,
        # and one shared threshold would hold each op to the others' loss.
        *(Rule(f"RUSTCCL_SHM_{op.upper()}_ATTACH_MIN_BYTES", ("65536", "262144", "1048576", "4194304", "off"),
               tuple((op, b) for b in big))
          for op in ("all_reduce", "all_gather", "reduce_scatter", "reduce")),
        Rule("RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES", ("65536", "1048576", "4194304", "off"),
             tuple(("broadcast", b) for b in big)),
        Rule("RUSTCCL_SHM_BLOCK_READ_MIN_BYTES", ("16384", "65536", "262144", "1048576"),
             tuple((op, b) for op in ("all_to_all", "gather") for b in (64 * KiB, 512 * KiB, 4 * MiB))),
    ]
    per_rank = max(1, cores // max(1, local_ranks))
    threads = tuple(str(t) for t in (1, 2, 4, 8) if t <= per_rank)
    if len(threads) > 1:
        out.append(Rule("RUSTCCL_SHM_THREADS", threads,
                        tuple((op, b) for op in ("all_reduce", "all_gather", "broadcast") for b in (1 * MiB, top))))
    return out


def _share(comm, value: float) -> float:
    """Rank 0's `value` on every rank (over `comm`)."""
    a = np.array([value], np.float64)
    comm.broadcast(a, 0)
    return float(a[0])


def time_cell(comms: list, op: str, nbytes: int, rank: int, world: int, rounds: int, round_s: float) -> list[list[float]]:
    """Per communicator, its seconds per call of `op` in each of `rounds`
    alternating rounds (rank 0's clock; every rank runs the same calls)."""
    arrays = Buffers(nbytes, rank, world, fill=False)
    fns = [communicator_call(c, op, arrays, rank) for c in comms]
    est = []
    for c, fn in zip(comms, fns):  # warm-up, and how long a call takes
        c.barrier()
        fn()
        t0 = time.perf_counter()
        fn()
        est.append(time.perf_counter() - t0)
    iters = int(_share(comms[0], float(min(500, max(2, round_s / max(max(est), 1e-7))))))
    per = [[] for _ in comms]
    for r in range(rounds):
        for k in range(len(comms)):
            i = (k + r) % len(comms)
            comms[i].barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fns[i]()
            per[i].append((time.perf_counter() - t0) / iters)
    return per


def _connect(store, rank: int, size: int, group: str, tag: str, settings: dict[str, str]):
    from .._rustccl import Communicator

    return Communicator.bootstrap(store, rank, size, 120.0, f"{group}/tune/{tag}", None, sorted(settings.items()))


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def choose(ratios: dict[str, list[float]]) -> str:
    """The candidate that replaces the rule, from each one's time per cell
    over the rules' (``"rules"``: none): the fastest (geometric mean) of
    those slower on no cell by more than ``NOISE``, where its mean is at
    most ``WIN``. A threshold too low can lose on the small cells where a
    higher one still wins the large."""
    fair = [tag for tag in ratios if tag != "rules" and max(ratios[tag]) <= NOISE]
    best = min(fair, key=lambda tag: _geomean(ratios[tag]), default="rules")
    return best if best != "rules" and _geomean(ratios[best]) <= WIN else "rules"


def tune_group(store, rank: int, size: int, group: str = "tune", rounds: int = 9, round_s: float = 0.005,
               only: list[str] | None = None, where: str | None = None, log=None) -> dict:
    """Measures this host's table with every rank of a group on it (each
    calls this with the same arguments); rank 0 caches it (in `where`, or
    ``RUSTCCL_TUNE_DIR``) and returns it, the others return the same
    settings. `only`: tune these rules alone."""
    say = log or (lambda *_: None)
    tuned = [r for r in rules(size, os.cpu_count() or 1) if not only or r.name in only]
    chosen: dict[str, str] = {}
    started = time.perf_counter()
    for rule in tuned:
        # The rules run twice, as two communicators: one communicator can
        # run slower than another of the same settings for its whole life
        # (where its memory and threads landed), and a candidate must beat
        # the faster of the two.
        variants = [("rules", dict(chosen)), ("rules#2", dict(chosen))]
        variants += [(v, {**chosen, rule.name: v}) for v in rule.candidates]
        comms = [_connect(store, rank, size, group, f"{rule.name}={tag}", s) for tag, s in variants]
        try:
            times = {}
            for op, nbytes in rule.cells:
                per = time_cell(comms, op, nbytes, rank, size, rounds, round_s)
                med = [statistics.median(p) for p in per]
                times[(op, nbytes)] = [min(med[:2])] + med[2:]
        finally:
            for c in comms:
                c.shutdown()
        tags = ["rules"] + [tag for tag, _ in variants[2:]]
        ratios = {tag: [t[i] / t[0] for t in times.values()] for i, tag in enumerate(tags)}
        # every rank keeps rank 0's verdict
        pick = int(_share_over(store, rank, size, group, rule.name, tags.index(choose(ratios))))
        if pick:
            chosen[rule.name] = tags[pick]
        say(f"{rule.name}: " + ", ".join(f"{tag} {_geomean(r):.2f}" for tag, r in ratios.items()) + f" -> {tags[pick]}")
    cells = validate(store, rank, size, group, chosen, tuned, rounds, round_s, say)
    if rank == 0:
        table = new_table(size, chosen, cells)
        table["seconds"] = round(time.perf_counter() - started, 1)
        save(table, where)
        return table
    return new_table(size, chosen, [])


def _share_over(store, rank: int, size: int, group: str, name: str, value: int) -> int:
    """Rank 0's `value` for rule `name`, through the store."""
    key = f"rustccl/tune/{group}/pick/{name}"
    if rank == 0:
        store.set(key, str(value).encode())
        return value
    return int(bytes(store.get(key)).decode())


def validate(store, rank: int, size: int, group: str, chosen: dict[str, str], tuned: list[Rule], rounds: int,
             round_s: float, say) -> list[dict]:
    """Times the rules against `chosen` on every tuned cell, in fresh
    rounds, and takes back (from `chosen`, on every rank) each choice one
    of whose cells came out slower than ``1 / FLOOR`` of the rules' time.
    Returns the cells of the `tuned` rules: op, bytes, rules' and tuned
    times (median and range of the rounds, in us)."""
    if not chosen:
        return []
    cells = [(r.name, op, b) for r in tuned for op, b in r.cells]
    comms = [_connect(store, rank, size, group, "validate-rules", {}),
             _connect(store, rank, size, group, "validate-rules#2", {}),
             _connect(store, rank, size, group, "validate-tuned", chosen)]
    out, slower = [], set()
    try:
        for name, op, nbytes in cells:
            per = time_cell(comms, op, nbytes, rank, size, rounds, round_s)
            us = [sorted(x * 1e6 for x in p) for p in per]
            med = [statistics.median(u) for u in us]
            # the faster of the rules' two communicators
            if med[1] < med[0]:
                us, med = us[1:], med[1:]
            else:
                us, med = [us[0], us[2]], [med[0], med[2]]
            out.append({"rule": name, "op": op, "bytes": nbytes, "world": size,
                        "rules_us": med[0], "rules_us_min": us[0][0], "rules_us_max": us[0][-1],
                        "tuned_us": med[1], "tuned_us_min": us[1][0], "tuned_us_max": us[1][-1],
                        "speedup": med[0] / med[1]})
            if name in chosen and med[0] / med[1] < FLOOR:
                slower.add(name)
    finally:
        for c in comms:
            c.shutdown()
    back = sorted(slower) if rank == 0 else []
    keep = _share_over(store, rank, size, group, "validate", sum(1 << i for i, n in enumerate(sorted(chosen))
                                                                      if n in back))
    for i, n in enumerate(sorted(chosen)):
        if keep >> i & 1:
            say(f"{n}: slower than the rules on a cell when validated; back to the rule")
            del chosen[n]
    for c in out:
        c["kept"] = c["rule"] in chosen
    return out
