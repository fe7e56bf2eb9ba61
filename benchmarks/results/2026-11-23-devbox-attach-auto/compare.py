"""rustccl's time per variant in this folder's A/B runs (rustccl vs gloo
in one process; files EXPERIMENT-VARIANT-RUN.jsonl): per (op, size), the
rustccl time of each run and the median rustccl/gloo ratio.

    python compare.py off     # off-default-*, off-off-*
    python compare.py auto    # auto-16777216-*, auto-auto-*
"""
import collections
import glob
import json
import os
import statistics
import sys

exp = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
us = collections.defaultdict(lambda: collections.defaultdict(list))
rat = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(os.path.join(here, f"{exp}-*.jsonl"))):
    variant = os.path.basename(f)[len(exp) + 1:].rsplit("-", 1)[0]
    rows = [r for r in (json.loads(line) for line in open(f)) if "op" in r and "size" in r]
    gloo = {(r["op"], r["size"]): r["us"] for r in rows if r.get("backend") == "gloo"}
    seen = set()
    for r in rows:
        k = (r["op"], r["size"])
        if r.get("backend") == "rustccl" and k not in seen:
            seen.add(k)
            us[k][variant].append(r["us"])
            rat[k][variant].append(gloo[k] / r["us"])
for k in sorted(us):
    cols = [f"{v}: us {[round(x) for x in us[k][v]]} x{statistics.median(rat[k][v]):.1f}" for v in sorted(us[k])]
    print(f"{k[0]:15s} {k[1] >> 10:6d} KiB  " + "   ".join(cols))
