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
