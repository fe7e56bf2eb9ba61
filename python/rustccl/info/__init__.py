"""What rustccl sees in this process: attach it to bug reports.

    python -m rustccl.info            # a short summary: versions, cores, CUDA devices, settings changed
    python -m rustccl.info --json     # everything as JSON: attach it to bug reports
    rustccl.info()                    # the same as a dict, plus every live rustccl group of the
                                      # process: the link to each peer (shm / tcp, address), the
                                      # group's CUDA device and one-shot all-reduce state

Inside a job, call ``rustccl.info()`` after ``init_process_group`` on each
rank (e.g. ``print(json.dumps(rustccl.info()))``) to see the links each rank
chose. It initialises the CUDA driver in the calling process (where there is
one), so a process that forks CUDA workers afterwards should not call it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any

from .. import _rustccl

# The one-shot CUDA all-reduce's limits (src/comm/nccl/custom.rs).
_ONE_SHOT_MAX_RANKS = 8
_ONE_SHOT_MIN_CC = (8, 0)


def _versions() -> dict[str, Any]:
    build = _rustccl.build_info()
    torch = sys.modules.get("torch")
    out: dict[str, Any] = {
        "rustccl": _rustccl.__version__,
        "built_against_torch": build["torch"],
        "shim": _shim_state(),
        "torch": None if torch is None else str(torch.__version__),
        "torch_cuda": None if torch is None else getattr(torch.version, "cuda", None),
        "python": platform.python_version(),
        "numpy": None,
        "nccl": None,
        "cuda_driver": None,
    }
    try:
        out["numpy"] = metadata.version("numpy")
    except metadata.PackageNotFoundError:
        pass
    try:
        out["nccl"] = _rustccl._nccl_version()
    except RuntimeError as e:
        out["nccl_error"] = str(e)
    return out


def _shim_state() -> dict[str, Any] | None:
    """The torch backend's shim loaded in this process: its path, how it was
    found (prebuilt, compiled or cached) and the torch it serves; None before
    it loads (no torch)."""
    from .. import _shims

    return _shims.loaded


def _host() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "identity": _rustccl.host_identity(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "pid": os.getpid(),
    }


def _cuda() -> dict[str, Any]:
    try:
        report = dict(_rustccl._cuda_report())
    except RuntimeError as e:
        return {"available": False, "error": str(e)}
    report["available"] = True
    report["visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return report


def _one_shot(group: dict[str, Any], cuda: dict[str, Any], setting: str) -> dict[str, Any]:
    """Whether the group's small CUDA all-reduces can take the one-shot
    NVLink kernel, why not, and what the engine decided once it ran."""
    why_not = []
    if setting in ("0", "false", "FALSE"):
        why_not.append("RUSTCCL_CUSTOM_ALLREDUCE=0")
    if not 2 <= group["size"] <= _ONE_SHOT_MAX_RANKS:
        why_not.append(f"group of {group['size']} ranks (2-{_ONE_SHOT_MAX_RANKS} needed)")
    if not group["single_host"]:
        why_not.append("ranks on more than one host")
    if not cuda.get("available"):
        why_not.append("no CUDA driver")
    else:
        devices = cuda["devices"]
        old = [d["index"] for d in devices if tuple(int(x) for x in d["compute_capability"].split(".")) < _ONE_SHOT_MIN_CC]
        if old:
            why_not.append(f"devices {old} below compute capability 8.0")
        if len(devices) < group["size"]:
            why_not.append(f"{len(devices)} visible devices: every rank's GPU must be visible to every rank")
        elif any(k not in ("self", "nvlink") for row in cuda["peers"] for k in row):
            why_not.append("not every pair of visible devices is an NVLink peer")
    state = "no CUDA collective yet"
    if group["cuda"] is not None:
        per = group["cuda"]["one_shot_bytes"]
        device = group["cuda"]["device"]
        if device not in per:
            state = "not set up yet (the first eligible all_reduce sets it up)"
        elif per[device] is None:
            state = "off (set up failed on some rank; RUSTCCL_DEBUG=INFO logs why)"
        else:
            state = f"on cuda:{device}, {per[device]} B of buffers"
    return {"eligible": not why_not, "why_not": why_not, "state": state}


def info() -> dict[str, Any]:
    """Versions, this host, CUDA devices and their peer links, every live
    rustccl group (link to each peer, one-shot all-reduce eligibility) and
    every ``RUSTCCL_*`` setting with its value and default."""
    settings = _rustccl.config()
    cuda = _cuda()
    versions = _versions()
    versions["cuda_driver"] = cuda.get("driver")
    groups = []
    for g in _rustccl._groups():
        g = dict(g)
        g["one_shot"] = _one_shot(g, cuda, settings["RUSTCCL_CUSTOM_ALLREDUCE"]["value"])
        groups.append(g)
    return {
        "versions": versions,
        "host": _host(),
        "cuda": cuda,
        "groups": groups,
        "settings": settings,
    }


def summary(report: dict[str, Any]) -> str:
    """A few lines a person reads: versions, host, CUDA, the settings that
    differ from their defaults."""
    v, h, c = report["versions"], report["host"], report["cuda"]
    lines = [
        f"rustccl {v['rustccl']}, torch {v['torch']}, python {v['python']}, numpy {v['numpy']}",
        "torch backend: " + (f"{v['shim']['how']} shim for torch {v['shim']['torch']} ({v['shim']['path']})"
                             if v["shim"] else "not loaded (no torch)"),
        f"host {h['hostname']} ({h['identity']}): {h['cores']} cores, {h['usable_cores']} usable, {h['platform']}",
    ]
    if c.get("available"):
        names = ", ".join(f"cuda:{d['index']} {d.get('name', '')}".strip() for d in c.get("devices", []))
        lines.append(f"CUDA driver {c.get('driver')}, NCCL {v.get('nccl')}: {names or 'no devices'}")
    else:
        lines.append(f"CUDA: not available ({c.get('error', 'no driver')})")
    changed = {k: s for k, s in report["settings"].items() if s["value"] != s["default"]}
    if changed:
        lines.append("settings that differ from their defaults:")
        lines += [f"  {k}={s['value']} (default {s['default']})" for k, s in sorted(changed.items())]
    else:
        lines.append("every RUSTCCL_* setting at its default")
    lines.append(f"{len(report['groups'])} live rustccl group(s); --json prints everything")
    return "\n".join(lines)


def settings_table() -> str:
    """The settings as a Markdown table (docs/settings.md is generated
    from it, and a test checks that the two agree)."""
    intro = {
        "use": "",
        "tuning": "**Tuning.** The rules fitted per host choose these (`docs/decisions/0004`); set one to "
                  "experiment, or where a rule gets your host wrong (and tell us):",
        "debug": "**Debugging.** For rustccl's own tests and profiling:",
    }
    out = []
    for kind, text in intro.items():
        rows = [text, ""] if text else []
        rows += ["| variable | default | meaning |", "|---|---|---|"]
        for name, s in _rustccl.config().items():
            if s["kind"] == kind:
                doc = s["doc"].replace("|", "\\|")
                rows.append(f"| `{name}` | {s['default'] or '(unset)'} | {doc} |")
        out.append("\n".join(rows))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rustccl.info", description="What rustccl sees in this process.")
    ap.add_argument("--json", action="store_true", help="print everything as JSON (for bug reports)")
    ap.add_argument("--settings-md", action="store_true", help="print every setting as a Markdown table")
    args = ap.parse_args(argv)
    if args.settings_md:
        print(settings_table())
    elif args.json:
        json.dump(info(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(summary(info()))
