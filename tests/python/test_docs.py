"""The docs build clean and every example in them runs.

Every fenced ``python`` block of README.md and docs/*.md runs as a 2-rank
job under torchrun, so an example cannot rot. A block that cannot run here
is preceded by ``<!-- example: skip: REASON -->`` where REASON starts with
one of SKIP_REASONS; the test reports it as skipped with that reason."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKIP_REASONS = ("needs a GPU", "needs root", "needs two hosts", "needs TLS", "needs torchft", "needs a rank to die")
_BLOCK = re.compile(r"(?:<!-- example: skip: (?P<why>[^>]*?) -->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def _blocks():
    for page in PAGES:
        text = page.read_text()
        for m in _BLOCK.finditer(text):
            line = text[: m.start("code")].count("\n")
            yield pytest.param(m.group("code"), m.group("why"), id=f"{page.relative_to(ROOT)}:{line}")


@pytest.mark.parametrize("code,why", list(_blocks()))
def test_example_runs_on_two_ranks(code, why, tmp_path):
    if why is not None:
        assert why.startswith(SKIP_REASONS), f"skip reason {why!r} is not one of {SKIP_REASONS}"
        pytest.skip(why)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUSTCCL_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-6000:]}"


def test_docs_build_without_warnings(tmp_path):
    """Sphinx with -W -n: a broken internal link or reference fails."""
    if shutil.which("sphinx-build", path=os.path.dirname(sys.executable)) is None:
        pytest.fail("sphinx-build is missing: the test command installs it (Makefile)")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", str(ROOT / "docs"), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-6000:]
