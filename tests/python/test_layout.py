"""The engine's layers: no module imports one above it.

Each top-level module of src/ sits in a layer; `use crate::X` (or a path
through `crate::X`) may name only modules of its own layer or below. An
import that runs back up a layer fails here, naming the file and line."""

from __future__ import annotations

import pathlib
import re

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# Lowest first. Within a layer modules may use each other.
LAYERS = [
    {"types", "error"},
    {"config", "profile"},
    {"tuning"},
    {"tensor", "cuda", "work", "bootstrap", "tls"},
    {"transport"},
    {"collectives"},
    {"comm"},
    {"capi"},
    {"py"},
]
LEVEL = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def _module(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


def test_every_module_has_a_layer():
    tops = {_module(p) for p in SRC.rglob("*.rs")} - {"lib"}
    assert tops <= set(LEVEL), f"modules without a layer: {sorted(tops - set(LEVEL))}"


def test_no_import_runs_up_a_layer():
    up = []
    for path in sorted(SRC.rglob("*.rs")):
        me = _module(path)
        if me == "lib":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for target in re.findall(r"\bcrate::(\w+)", line):
                if target in LEVEL and LEVEL[target] > LEVEL[me]:
                    up.append(f"{path.relative_to(SRC.parent)}:{n}: {me} uses {target}")
    assert not up, "imports that run up a layer:\n" + "\n".join(up)


# What a comment in src/ must not hold: the evidence for a rule lives in
# docs/decisions/ (measurements go stale; the rule's reason does not).
NOTEBOOK = [
    (re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"), "a date"),
    (re.compile(r"benchmarks/results"), "a result path"),
    (re.compile(r"\b\d+(\.\d+)?-\d+(\.\d+)?x\b"), "a measured range of ratios"),
    (re.compile(r"\b\d+(\.\d+)?x (gloo|nccl|mpi|faster|slower|the time|less|more|longer)\b", re.I), "a measured ratio"),
    (re.compile(r"\btook \d"), "a timing"),
    (re.compile(r"\b(on|from) the (2|16|32|64)-core (VM|host)\b"), "a measurement's host"),
]


def test_comments_in_src_say_why_without_measurements_dates_or_result_paths():
    found = []
    for path in sorted(SRC.rglob("*.rs")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            text = line.strip()
            if not text.startswith("//"):
                continue
            for pattern, what in NOTEBOOK:
                if pattern.search(text):
                    found.append(f"{path.relative_to(SRC.parent)}:{n}: {what}: {text}")
    assert not found, "move these to a decision page (docs/decisions/):\n" + "\n".join(found)
