"""Compares two sets of A/B sweeps (JSONL files of python -m rustccl.bench):

    python benchmarks/compare_runs.py 'results/x/*-on-*.jsonl' 'results/x/*-off-*.jsonl'

prints a markdown table: per op and size, rustccl's time in each sweep of A
and of B, B/A of their medians (> 1: A faster), and rustccl/gloo (the median
over each set's sweeps of the ratio measured within a sweep); the pipeline
step too when the sweeps have it. The committed sweeps are gzipped
(`.jsonl.gz`): a pattern ending in `.jsonl` matches those too.

A pattern may end in `@BACKEND` to compare that backend's rows instead of
rustccl's, e.g. a `--variant` of the same sweeps:

    python benchmarks/compare_runs.py 'x/*.jsonl' 'x/*.jsonl@rustccl:slot'

When A and B are the same files, B/A is the median of the ratios measured
within each sweep (the two groups alternated in one process). A second
table gives each op's geometric mean of B/A over its sizes, also with each
run's own gloo as the yardstick (for builds timed in alternating runs)."""

import glob
import gzip
import json
import statistics
import sys


def load(pattern: str) -> dict:
    """{(op, bytes, backend): [us per sweep]} over the files matching `pattern`."""
    d: dict = {}
    files = set(glob.glob(pattern))
    if pattern.endswith(".jsonl"):
        # a sweep kept both ways counts once
        files |= {g for g in glob.glob(pattern + ".gz") if g.removesuffix(".gz") not in files}
    for f in sorted(files):
        for line in (gzip.open(f, "rt") if f.endswith(".gz") else open(f)):
            j = json.loads(line)
            if j.get("kind") == "result" and "us" in j:
                d.setdefault((j["op"], j["bytes"], j["backend"]), []).append(j["us"])
            elif j.get("kind") == "ratio" and j["op"] == "pp_step":
                d.setdefault(("pp_step", 0, "rustccl"), []).append(j["ms"] * 1000)
                d.setdefault(("pp_step", 0, "gloo"), []).append(j["ms_vs"] * 1000)
    return d


def size(b: int) -> str:
    return f"{b >> 20}M" if b >= 1 << 20 else f"{b >> 10}K" if b >= 1024 else str(b)


def main(a_arg: str, b_arg: str) -> None:
    (a_pattern, _, a_name), (b_pattern, _, b_name) = a_arg.partition("@"), b_arg.partition("@")
    a_name, b_name = a_name or "rustccl", b_name or "rustccl"
    a_runs, b_runs = load(a_pattern), load(b_pattern)
    paired = a_pattern == b_pattern
    print("| op | bytes | A us | B us | B/A | A x gloo | B x gloo |")
    print("|---|---|---|---|---|---|---|")
    per_op: dict = {}
    for op in dict.fromkeys(k[0] for k in a_runs):
        for b in sorted({k[1] for k in a_runs if k[0] == op}):
            a, bb = a_runs.get((op, b, a_name)), b_runs.get((op, b, b_name))
            ga, gb = a_runs.get((op, b, "gloo")), b_runs.get((op, b, "gloo"))
            if not a or not bb:
                continue
            ratio_a = f"{statistics.median(g / x for g, x in zip(ga, a)):.1f}" if ga else ""
            ratio_b = f"{statistics.median(g / x for g, x in zip(gb, bb)):.1f}" if gb else ""
            b_over_a = (statistics.median(y / x for x, y in zip(a, bb)) if paired
                        else statistics.median(bb) / statistics.median(a))
            print(f"| {op} | {size(b)} | {' / '.join(f'{x:.1f}' for x in a)} | {' / '.join(f'{x:.1f}' for x in bb)} "
                  f"| {b_over_a:.2f} | {ratio_a} | {ratio_b} |")
            # the same ratio with each run's own gloo as the yardstick,
            # which cancels a host that got slower or faster between runs
            vs_gloo = (statistics.median(x / g for g, x in zip(gb, bb)) / statistics.median(x / g for g, x in zip(ga, a))
                       if ga and gb else None)
            per_op.setdefault(op, []).append((b_over_a, vs_gloo))
    print()
    print("| op | B/A, geometric mean over sizes | B/A against each run's gloo |")
    print("|---|---|---|")
    for op, cells in per_op.items():
        gm = statistics.geometric_mean(r for r, _ in cells)
        norm = [v for _, v in cells if v]
        print(f"| {op} | {gm:.3f} | {statistics.geometric_mean(norm):.3f} |" if norm else f"| {op} | {gm:.3f} | |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
