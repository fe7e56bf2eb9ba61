import json, glob, collections, sys, re
d = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")):
    m = re.search(r"-(\d+)rank-(\w+)-r(\d)\.jsonl", f); W, v, rep = m.group(1), m.group(2), m.group(3)
    rows = [json.loads(l) for l in open(f)]
    us = {}
    for r in rows:
        if r.get("kind") != "result": continue
        us[(r["op"], r["bytes"], r["backend"])] = r["us"]
    for (op, b, be), u in us.items():
        if be != "rustccl": continue
        g = us.get((op, b, "gloo"))
        d[(int(W), op, b)].setdefault(v, []).append(f"{u:.0f}({g/u:.1f})" if g else f"{u:.0f}")
vs = sorted({v for x in d.values() for v in x})
print("W op bytes | " + " | ".join(vs))
for k in sorted(d):
    print(k[0], k[1], f"{k[2]>>10}K", "|", " | ".join(" ".join(d[k].get(v, [])) for v in vs))
