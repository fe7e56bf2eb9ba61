"""What the installed package needs and says about itself: which shim
serves the running torch (prebuilt, or compiled on first import), the
numpy Communicator without torch, rustccl.info(), and the type stub."""

from __future__ import annotations

import ast
import json
import pathlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import launch
import rustccl
from rustccl import _rustccl, _shims

ROOT = Path(__file__).resolve().parents[2]

# Makes torch unimportable in a subprocess, as in an environment without it.
BLOCK_TORCH = textwrap.dedent("""
    import sys

    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
            return None

    sys.meta_path.insert(0, _NoTorch())
""")

# Files of this process that come from torch or from rustccl's torch shim.
MAPPED_TORCH = textwrap.dedent("""
    def mapped_torch():
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
        return sorted(p for p in paths if "libtorch" in p or "libc10" in p or p.endswith("_shim.so"))
""")


def _python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)


# --- the shim for the running torch -------------------------------------------

def test_build_records_the_torch_it_was_compiled_against():
    built = _rustccl.build_info()
    assert built["rustccl"] == rustccl.__version__
    # this test environment built rustccl against the torch it runs
    assert built["torch"] == {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    }


def _fake_torch(version: str, abi: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(__version__=version, _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=abi))


def test_the_prebuilt_shim_serves_its_minor_release_and_abi_only(monkeypatch):
    built = _rustccl.build_info()["torch"]
    major, minor, patch = _shims.release(built["version"])
    abi = built["cxx11_abi"]
    monkeypatch.delenv("RUSTCCL_BUILD_SHIM", raising=False)
    # any CUDA flavour and any patch release of the same minor
    for v in (f"{major}.{minor}.{patch}", f"{major}.{minor}.{patch}+cpu", f"{major}.{minor}.{patch + 1}+cu126"):
        assert _shims.prebuilt(_fake_torch(v, abi)) is not None, v
    # another minor release, or the other C++ ABI: a shim compiled for it
    for v, a in ((f"{major}.{minor + 1}.0", abi), (f"{major}.{minor}.{patch}", not abi)):
        assert _shims.prebuilt(_fake_torch(v, a)) is None, (v, a)
    monkeypatch.setenv("RUSTCCL_BUILD_SHIM", "compile")
    assert _shims.prebuilt(_fake_torch(built["version"], abi)) is None
    assert _shims.release("2.12.1+cu130") == (2, 12, 1) and _shims.release("2.16.0a0+git1234") == (2, 16, 0)


def test_a_shim_prebuilt_for_another_release_serves_it(monkeypatch, tmp_path):
    """The wheel's shims for other releases (rustccl/_shims/<tag>/): a
    non-empty one serves its minor release and ABI, an empty placeholder
    (a build that had none for it) does not."""
    monkeypatch.delenv("RUSTCCL_BUILD_SHIM", raising=False)
    monkeypatch.setattr(_shims, "_PKG", tmp_path)
    (tmp_path / "_shims" / "torch2.13-cxx11abi1").mkdir(parents=True)
    (tmp_path / "_shims" / "torch2.14-cxx11abi1").mkdir(parents=True)
    (tmp_path / "_shims" / "torch2.13-cxx11abi1" / "_shim.so").write_bytes(b"\x7fELF")
    (tmp_path / "_shims" / "torch2.14-cxx11abi1" / "_shim.so").write_bytes(b"")
    got = _shims.prebuilt(_fake_torch("2.13.1+cu130", True))
    assert got == tmp_path / "_shims" / "torch2.13-cxx11abi1" / "_shim.so"
    assert _shims.prebuilt(_fake_torch("2.13.0", False)) is None
    assert _shims.prebuilt(_fake_torch("2.14.0", True)) is None


def test_a_torch_older_than_2_11_is_refused_before_the_shim_loads():
    code = MAPPED_TORCH + textwrap.dedent("""
        import sys, types
        fake = types.ModuleType("torch")
        fake.__version__ = "2.10.0"
        sys.modules["torch"] = fake
        try:
            import rustccl
        except ImportError as e:
            print("IMPORT_ERROR", e)
        print("MAPPED", mapped_torch())
    """)
    r = _python(code)
    assert r.returncode == 0, r.stderr
    err = next(line for line in r.stdout.splitlines() if line.startswith("IMPORT_ERROR"))
    assert "2.10.0" in err and "needs torch >= 2.11" in err and "pip install -U torch" in err
    assert "MAPPED []" in r.stdout


COMPILED_RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    import rustccl

    dist.init_process_group("rustccl", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
    t = torch.arange(4.0)
    dist.all_reduce(t)
    dist.destroy_process_group()
    print(json.dumps({"shim": rustccl.info()["versions"]["shim"], "sum": t.tolist()}))
""")


def test_the_shim_is_compiled_on_first_import_and_cached(tmp_path):
    """A torch that no prebuilt shim serves: import compiles one against it
    (once, under a lock the ranks share), and the next import finds it."""
    env = dict(os.environ, RUSTCCL_BUILD_SHIM="compile", RUSTCCL_BUILD_CACHE_DIR=str(tmp_path))

    def run():
        p = subprocess.run([sys.executable, "-c", COMPILED_RANK, str(launch.free_port())], capture_output=True,
                           text=True, timeout=900, env=env)
        assert p.returncode == 0, p.stderr[-6000:]
        return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr

    first, err = run()
    assert first["sum"] == [0.0, 1.0, 2.0, 3.0]
    assert first["shim"]["how"] == "compiled" and first["shim"]["path"].startswith(str(tmp_path)), first
    assert "rustccl: compiling its torch backend for torch" in err
    second, err = run()
    assert second["shim"] == dict(first["shim"], how="cached") and "compiling" not in err, second


# --- without torch -----------------------------------------------------------

NUMPY_RANK = BLOCK_TORCH + MAPPED_TORCH + textwrap.dedent("""
    import json, sys
    import numpy as np
    import rustccl

    rank, world, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    comm = rustccl.Communicator.bootstrap(rustccl.FileStore(path), rank, world, 60.0)
    x = np.arange(1000, dtype=np.float64) * (rank + 1)
    comm.all_reduce(x)
    try:
        rustccl.register()
        backend = "registered"
    except ImportError as e:
        backend = str(e)
    links = [p["link"] for p in rustccl.info()["groups"][0]["peers"]]
    comm.shutdown()
    print(json.dumps({"sum": x.tolist(), "torch": "torch" in sys.modules, "mapped": mapped_torch(),
                      "backend": backend, "links": links}))
""")


def test_numpy_communicator_without_torch():
    world = 2
    store = tempfile.mkdtemp(prefix="rustccl-notorch-")
    procs = [
        subprocess.Popen([sys.executable, "-c", NUMPY_RANK, str(r), str(world), store],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    want = (np.arange(1000, dtype=np.float64) * sum(r + 1 for r in range(world))).tolist()
    for rank, (out, _) in enumerate(outs):
        got = json.loads(out.strip().splitlines()[-1])
        assert got["sum"] == want
        assert got["torch"] is False and got["mapped"] == []
        assert "needs torch (>= 2.11)" in got["backend"] and "Communicator works without it" in got["backend"]
        assert got["links"][rank] == "self" and got["links"][1 - rank] in ("shm", "tcp")


def test_with_torch_the_shim_is_loaded():
    # the other side of the check above: it can see the shim when it is there
    r = _python(MAPPED_TORCH + "import rustccl\nprint(mapped_torch())")
    assert r.returncode == 0, r.stderr
    assert "_shim.so" in r.stdout and "libtorch" in r.stdout


# --- rustccl.info() ----------------------------------------------------------

def test_info_of_this_process():
    report = rustccl.info()
    v = report["versions"]
    assert v["rustccl"] == rustccl.__version__
    assert v["torch"] == torch.__version__ and v["numpy"] == np.__version__
    assert v["built_against_torch"] == _rustccl.build_info()["torch"]
    assert (v["nccl"] is None) != ("nccl_error" not in v)
    assert report["host"]["cores"] == os.cpu_count()
    assert report["host"]["identity"] == rustccl.host_identity()
    assert report["settings"] == rustccl.config()
    assert all(k.startswith("RUSTCCL_") and {"value", "default"} <= set(s) for k, s in report["settings"].items())
    cuda = report["cuda"]
    if cuda["available"]:
        n = len(cuda["devices"])
        assert len(cuda["peers"]) == n and all(cuda["peers"][i][i] == "self" for i in range(n))
    else:
        assert "libcuda" in cuda["error"] and v["cuda_driver"] is None
    json.dumps(report)  # plain data


def test_python_m_rustccl_info(tmp_path):
    env = dict(os.environ, RUSTCCL_SEGMENT_BYTES="65536")
    short = subprocess.run([sys.executable, "-m", "rustccl.info"], capture_output=True, text=True, timeout=120, env=env)
    assert short.returncode == 0, short.stderr
    assert f"rustccl {rustccl.__version__}" in short.stdout and "RUSTCCL_SEGMENT_BYTES=65536 (default 524288)" in short.stdout
    assert len(short.stdout.splitlines()) < 20, short.stdout
    usage = subprocess.run([sys.executable, "-m", "rustccl.info", "--help"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and "--json" in usage.stdout and "{" not in usage.stdout, usage.stdout
    r = subprocess.run([sys.executable, "-m", "rustccl.info", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr, r.stderr
    report = json.loads(r.stdout)
    assert report["versions"]["rustccl"] == rustccl.__version__
    seg = report["settings"]["RUSTCCL_SEGMENT_BYTES"]
    assert seg["value"] == "65536" and seg["default"] == "524288"
    assert report["groups"] == []


@pytest.mark.parametrize("transport,link", [("auto", "shm"), ("tcp", "tcp")])
def test_info_reports_each_peer_link(transport, link):
    res = launch.run("w_info:groups", 2, env={"RUSTCCL_TRANSPORT": transport})
    pids = [r["pid"] for r in res]
    addrs = {}
    for rank, r in enumerate(res):
        assert r["settings"] == r["config"]
        assert r["settings"]["RUSTCCL_TRANSPORT"]["value"] == transport
        [g] = [g for g in r["groups"] if g["size"] == 2]
        assert g["rank"] == rank and g["single_host"] is True
        for p in g["peers"]:
            assert p["link"] == ("self" if p["rank"] == rank else link)
            assert p["pid"] == pids[p["rank"]]  # what the peer itself reported
            addrs.setdefault(p["rank"], set()).add(p["addr"])
        one_shot = g["one_shot"]
        assert one_shot["state"] == "no CUDA collective yet" and g["cuda"] is None
        if not torch.cuda.is_available():
            assert one_shot["eligible"] is False and "no CUDA driver" in one_shot["why_not"]
    # both ranks name the same address for each rank
    assert all(len(a) == 1 and re.fullmatch(r"[\d.]+:\d+|\[[0-9a-f:]+\]:\d+", next(iter(a))) for a in addrs.values())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_info_on_cuda_matches_torch_and_the_driver():
    world = 2
    res = launch.run("w_info:cuda_groups", world)
    for rank, r in enumerate(res):
        assert r["value"] == world
        report, ref = r["report"], r["ref"]
        cuda = report["cuda"]
        assert cuda["available"] and cuda["driver"] == ref["driver"] == report["versions"]["cuda_driver"]
        assert [d["name"] for d in cuda["devices"]] == ref["names"]
        assert [d["compute_capability"] for d in cuda["devices"]] == ref["cc"]
        n = len(ref["names"])
        for i in range(n):
            for j in range(n):
                assert (cuda["peers"][i][j] != "none") == ref["access"][i][j], (i, j, cuda["peers"])
        assert report["versions"]["nccl"] == ref["nccl"]
        [g] = [g for g in report["groups"] if g["size"] == world]
        assert g["cuda"]["device"] == rank and g["nccl"] == ref["nccl"]
        # what info() predicts is what the engine did on the first all_reduce
        one_shot = g["one_shot"]
        assert one_shot["eligible"] == one_shot["state"].startswith("on"), one_shot


# --- the type stub -----------------------------------------------------------

STUB = Path(_rustccl.__file__).with_name("_rustccl.pyi")


def _stub_names():
    """Top-level names the stub gives the module (not its private helper
    types), and the members it gives Communicator."""
    tree = ast.parse(STUB.read_text())
    top, members = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) or (isinstance(node, ast.ClassDef) and not node.name.startswith("_")):
            top.add(node.name)
        if isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef) and node.name == "Communicator":
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return top, members


def test_stub_is_shipped_and_names_every_attribute():
    assert STUB.is_file() and STUB.with_name("py.typed").is_file()
    top, members = _stub_names()
    runtime = {n for n in dir(_rustccl) if not n.startswith("__")} | {"__version__"}
    assert top == runtime
    own = {n for n in vars(_rustccl.Communicator) if not n.startswith("__")}
    assert members == own


def _mypy():
    return pytest.importorskip("mypy.api", reason="mypy is not installed (make setup installs it)")


def test_stubtest_agrees_with_the_module(tmp_path):
    _mypy()
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "rustccl._rustccl", "--mypy-config-file", os.devnull],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_stub_types_numpy_use_under_mypy_strict(tmp_path):
    api = _mypy()
    (tmp_path / "use.py").write_text(textwrap.dedent("""
        import numpy as np
        from rustccl import FileStore
        from rustccl._rustccl import Communicator, build_info

        def run(rank: int, world: int, path: str) -> float:
            comm = Communicator.bootstrap(FileStore(path), rank, world)
            x = np.arange(4, dtype=np.float32)
            comm.all_reduce(x, op="sum")
            comm.all_gather([x, x], x)
            src: int | None = comm.recv(x, src=None)
            version: str = build_info()["torch"]["version"]
            return float(x.sum()) + (src or 0) + len(version)

        def wrong(comm: Communicator) -> None:
            comm.send([1, 2], dst="1")
    """))
    out, err, status = api.run(["--strict", "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"),
                                str(tmp_path / "use.py")])
    errors = [line for line in out.splitlines() if ": error:" in line]
    # only the two mistakes in wrong() are reported
    assert len(errors) == 2 and all(":16:" in e for e in errors), out + err


def test_the_settings_page_is_generated_from_the_engine():
    """docs/settings.md holds the table `python -m rustccl.info
    --settings-md` prints, from the engine's one declaration of the
    settings: regenerate it when a setting changes."""
    from rustccl.info import settings_table

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    begin, end = "<!-- settings:begin (python -m rustccl.info --settings-md) -->\n", "\n<!-- settings:end -->"
    assert begin in page and end in page
    assert page.split(begin)[1].split(end)[0] == settings_table(), "docs/settings.md is stale: regenerate its table"
