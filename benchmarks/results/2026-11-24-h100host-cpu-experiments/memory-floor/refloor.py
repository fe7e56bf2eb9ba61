"""Recomputes every row's memory floor with the committed formulas
(rustccl.bench.metrics / membw) and rewrites the JSONL and markdown.
The runs here used scatter's floor before its fix (2(n-1)B instead of
2(n-1)B/n: `bytes` is the root's whole input); the timings are unchanged.

    python refloor.py FILE.jsonl ...
"""
import json
import sys

from rustccl.bench import membw, report

for path in sys.argv[1:]:
    recs = [json.loads(line) for line in open(path)]
    head, rows = recs[0], recs[1:]
    for r in rows:
        r.pop("mem_floor_us", None)
    res = [r for r in rows if r.get("kind") == "result" and r["op"] not in ("ddp_toy_step", "pp_step")]
    membw.annotate(res, head["copy_GBps"], head["host"], head.get("host_copy"))
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    ratio_rows = [r for r in rows if r.get("kind") == "ratio"]
    plain = [r for r in rows if r.get("kind") != "ratio"]
    with open(path[:-len(".jsonl")] + ".md", "w") as f:
        f.write(report.markdown(head, plain, ratio_rows, []))
