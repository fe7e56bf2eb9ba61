"""Compares two sets of A/B sweeps (JSONL of python -m rustccl.bench):
per op and size, rustccl's time in each run of A and of B, B/A of the
fastest runs (> 1: A faster), and each against gloo timed in the same
runs. Usage: cmp.py 'A glob' 'B glob' [--md]."""
import glob
import json
import sys


def load(pat):
    d = {}
    for f in sorted(glob.glob(pat)):
        for line in open(f):
            j = json.loads(line)
            if j.get("kind") == "result":
                d.setdefault((j["op"], j["bytes"], j["backend"]), []).append(j["us"])
    return d


A, B = load(sys.argv[1]), load(sys.argv[2])
md = "--md" in sys.argv
print("| op | bytes/rank | A us (runs) | B us (runs) | B/A | A vs gloo | B vs gloo |")
print("|---|---|---|---|---|---|---|")
ops = list(dict.fromkeys(k[0] for k in A))
for op in ops:
    for by in sorted({k[1] for k in A if k[0] == op}):
        a, b = A.get((op, by, "rustccl")), B.get((op, by, "rustccl"))
        ga, gb = A.get((op, by, "gloo")), B.get((op, by, "gloo"))
        if not a or not b:
            continue
        ma, mb = min(a), min(b)
        size = f"{by >> 20} MiB" if by >= 1 << 20 else f"{by >> 10} KiB"
        print(f"| {op} | {size} | {' / '.join(f'{x:.0f}' for x in a)} | {' / '.join(f'{x:.0f}' for x in b)} | {mb / ma:.2f} | {min(ga) / ma:.2f} | {min(gb) / mb:.2f} |")
