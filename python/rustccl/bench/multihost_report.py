"""Markdown for the two-host compression benchmark (multihost_rank)."""


def markdown(rows, a) -> str:
    sw = [r for r in rows if r["kind"] == "all_reduce"]
    dd = [r for r in rows if r["kind"] == "ddp"]
    head = rows[0] if rows else {}
    out = [f"Two hosts x {head.get('ranks_per_host', '?')} ranks (network namespaces on one machine, "
           f"{a.machine}), link `{a.link}` ({a.shaping}); rustccl, torch {head.get('torch', '?')}. "
           "Shared memory within a host, TCP between the host leaders; codecs only on that hop.", ""]
    if sw:
        out += ["### all_reduce (float32, SUM), median of rounds, slowest rank", "",
                "| size | " + " | ".join(f"{c} ms" for c in ("none", "bf16", "fp16", "int8")) +
                " | bf16 x | fp16 x | int8 x | int8 rel. error | link MiB/call none / int8 |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        by = {}
        for r in sw:
            by.setdefault(r["bytes"], {})[r["codec"]] = r
        for size, c in sorted(by.items()):
            out.append(f"| {size >> 20} MiB | " + " | ".join(f"{c[k]['us'] / 1e3:.1f}" for k in ("none", "bf16", "fp16", "int8"))
                       + " | " + " | ".join(f"{c[k]['speedup_vs_none']:.2f}" for k in ("bf16", "fp16", "int8"))
                       + f" | {c['int8']['rel_err']:.2g} | {c['none']['link_bytes_per_call'] / 2**20:.1f} / "
                         f"{c['int8']['link_bytes_per_call'] / 2**20:.1f} |")
        out.append("")
    if dd:
        base = next((r for r in dd if r["config"] == "none"), dd[0])
        d0 = dd[0]
        out += [f"### DDP toy training: 3 x Linear({d0['size']}, {d0['size']}), batch {d0['batch']}/rank, "
                f"{d0['steps']} SGD steps (lr {d0['lr']}), {d0['grad_bytes'] / 2**20:.1f} MiB of gradients", "",
                "| configuration | step ms | x vs none | final loss | vs none | link MiB/step (host A -> B) |",
                "|---|---:|---:|---:|---:|---:|"]
        for r in dd:
            out.append(f"| {r['config']} | {r['step_ms']:.1f} | {base['step_ms'] / r['step_ms']:.2f} | "
                       f"{r['final_loss']:.5f} | {r['final_loss'] / base['final_loss']:.4f} | "
                       f"{r['link_bytes_per_step'] / 2**20:.2f} |")
        out += ["", "Step time: median from step 10 on, slowest rank. Link bytes: the kernel's counter of host A's "
                "end of the link (everything A sent B, TCP/IP headers included)."]
    return "\n".join(out) + "\n"
