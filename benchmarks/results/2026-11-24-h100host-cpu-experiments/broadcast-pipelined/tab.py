import json,glob,collections,sys
rows=collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(sys.argv[1]+'/*.jsonl')):
    v=f.split('/')[-1][:-6].rsplit('-r',1)[0]
    for l in open(f):
        d=json.loads(l)
        if d.get('kind')!='result': continue
        rows[(d['op'],d['bytes'])][(v,d['backend'])].append(d['us'])
for (op,b),vs in sorted(rows.items()):
    out=[]
    for (v,be),us in sorted(vs.items()):
        if be=='rustccl':
            g=vs.get((v,'gloo'),[])
            out.append(f"{v}: "+"/".join(f"{u:.0f}" for u in us)+(" ("+"/".join(f"{x/u:.1f}" for u,x in zip(us,g))+"x)" if g else ""))
    print(op,f'{b>>10} KiB |',' | '.join(out))
