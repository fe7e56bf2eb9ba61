"""A tuned table's check against the rules, written as results (.jsonl
in the results schema, and a .md table)."""

from __future__ import annotations

import json
import os

from ..bench import schema
from ..bench.runner import free_stem


def rows(table: dict, machine: str) -> list[dict]:
    out = []
    for c in table.get("cells", []):
        for backend, key in (("rustccl", "rules"), ("rustccl:tuned", "tuned")):
            out.append({"kind": "result", "backend": backend, "device": "cpu", "world": c["world"], "op": c["op"],
                        "dtype": "float32", "bytes": c["bytes"], "us": c[f"{key}_us"], "us_min": c[f"{key}_us_min"],
                        "us_max": c[f"{key}_us_max"], "method": "ab", "rule": c["rule"], "machine": machine})
    return schema.stamp(out, backends=["rustccl", "rustccl:tuned"], machine=machine, commit=schema.git_commit())


def markdown(table: dict, machine: str, started) -> str:
    settings = table["settings"]
    lines = [
        f"# rustccl.tune: {table['local_ranks']} ranks, {machine}",
        "",
        f"{table['cpu_model']}, {table['cores']} cores, {table['numa_nodes']} NUMA node(s); "
        f"{started.isoformat(timespec='seconds')}; tuning took {table.get('seconds')} s.",
        "",
        "Table: " + (", ".join(f"`{k}={v}`" for k, v in settings.items()) or "the rules everywhere") + ".",
        "",
        "Time per call in us, median of the rounds [min-max], the rules and the table in the same processes, "
        "alternating; ratio: the rules' time / the table's (> 1: the table faster). A rule whose cell came out "
        "below 0.95 here went back to the rule (kept: no).",
        "",
        "| setting | op | bytes | rules us | tuned us | rules/tuned | kept |",
        "|---|---|---|---|---|---|---|",
    ]
    if not table.get("cells"):
        lines.append("")
        lines.append("No candidate beat the rules in the race: the table is the rules, and there was nothing to check.")
    for c in table.get("cells", []):
        lines.append(f"| {c['rule']} | {c['op']} | {c['bytes']} | {c['rules_us']:.1f} [{c['rules_us_min']:.1f}-"
                     f"{c['rules_us_max']:.1f}] | {c['tuned_us']:.1f} [{c['tuned_us_min']:.1f}-"
                     f"{c['tuned_us_max']:.1f}] | {c['speedup']:.2f} | {'yes' if c['kept'] else 'no'} |")
    return "\n".join(lines) + "\n"


def write(table: dict, out: str, machine: str, started) -> list[str]:
    os.makedirs(out, exist_ok=True)
    stem = free_stem(os.path.join(out, f"tune-{table['local_ranks']}rank"))
    head = {"kind": "header", "machine": machine, "date": started.isoformat(timespec="seconds"), "device": "cpu",
            "world": table["local_ranks"], "host_fingerprint": schema.host_fingerprint(),
            "tune_host_key": table["host_key"], "settings": table["settings"], "seconds": table.get("seconds"),
            "command": "python -m rustccl.tune"}
    with open(stem + ".jsonl", "w") as f:
        for r in [head, *rows(table, machine)]:
            f.write(json.dumps(r) + "\n")
    with open(stem + ".md", "w") as f:
        f.write(markdown(table, machine, started))
    return [stem + ".jsonl", stem + ".md"]
