"""cmp.py 'A glob' 'B glob': per op/size: rustccl us in each A and B run, B/A of medians, ratio vs gloo (median over runs)."""
import glob, json, sys, statistics as st
def load(pat):
    d = {}
    for f in sorted(glob.glob(pat)):
        for line in open(f):
            j = json.loads(line)
            if j.get("kind") == "result" and "us" in j:
                d.setdefault((j["op"], j["bytes"], j["backend"]), []).append(j["us"])
            if j.get("kind") == "ratio" and j["op"] == "pp_step":
                d.setdefault(("pp_step", 0, "rustccl"), []).append(j["ms"] * 1000)
                d.setdefault(("pp_step", 0, "gloo"), []).append(j["ms_vs"] * 1000)
    return d
A, B = load(sys.argv[1]), load(sys.argv[2])
print("| op | bytes | A us | B us | B/A | A x gloo | B x gloo |")
print("|---|---|---|---|---|---|---|")
for op in dict.fromkeys(k[0] for k in A):
    for by in sorted({k[1] for k in A if k[0] == op}):
        a, b = A.get((op, by, "rustccl")), B.get((op, by, "rustccl"))
        ga, gb = A.get((op, by, "gloo")), B.get((op, by, "gloo"))
        if not a or not b: continue
        ma, mb = st.median(a), st.median(b)
        rga = st.median([g / x for g, x in zip(ga, a)]); rgb = st.median([g / x for g, x in zip(gb, b)])
        size = f"{by >> 20}M" if by >= 1 << 20 else (f"{by >> 10}K" if by >= 1024 else f"{by}")
        print(f"| {op} | {size} | {' / '.join(f'{x:.1f}' for x in a)} | {' / '.join(f'{x:.1f}' for x in b)} | {mb / ma:.2f} | {rga:.1f} | {rgb:.1f} |")
