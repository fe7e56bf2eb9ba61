import json,sys,glob,collections,statistics,re
d=sys.argv[1]
rows=collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(d+'/*.jsonl')):
    m=re.search(r'rank-(\w+)-r(\d)\.jsonl',f); v=m.group(1)
    for l in open(f):
        r=json.loads(l)
        if r.get('kind')!='result': continue
        if 'op' not in r or 'backend' not in r: continue
        rows[(r['op'],r['bytes'])][(v,r['backend'])].append(r['us'])
vs=[]
for k in rows.values():
    for (v,b) in k:
        if v not in vs: vs.append(v)
print("op bytes | " + " | ".join(f"{v} us (ratio)" for v in vs))
for (op,b),k in sorted(rows.items()):
    cells=[]
    for v in vs:
        r=k.get((v,'rustccl'),[]); g=k.get((v,'gloo'),[])
        if not r: cells.append('-'); continue
        cells.append(" ".join(f"{x:.0f}({y/x:.1f})" for x,y in zip(r,g)))
    print(f"{op:14s} {b>>10:6d}K | "+" | ".join(cells))
