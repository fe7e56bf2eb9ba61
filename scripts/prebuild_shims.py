"""Builds the C++ shim for several torch releases from their wheels alone.

    python scripts/prebuild_shims.py OUT_DIR torch-2.12.0-*.whl torch-2.13.0-*.whl ...

Each torch wheel (``pip download --no-deps torch==X``) is unpacked only as
far as the shim needs (its headers and libc10 / libtorch_cpu / libtorch),
never installed; the shim is compiled against it into
``OUT_DIR/<tag>/_shim.so`` (tag: ``torch2.12-cxx11abi1``). A wheel build
that sets ``RUSTCCL_BUILD_SHIMS_DIR=OUT_DIR`` carries them
(``scripts/build_wheel.sh``), so that those releases need no compiler on
the user's machine.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBS = ("libc10.so", "libtorch_cpu.so", "libtorch.so")


def _build_module():
    spec = importlib.util.spec_from_file_location("_shim_build", ROOT / "python" / "rustccl" / "_shim_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _unpack(wheel: Path, into: Path) -> tuple[str, Path]:
    """torch's version, and where its headers and libraries were unpacked."""
    version = re.match(r"torch-([^-]+)-", wheel.name).group(1)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("torch/include/") or name in {f"torch/lib/{lib}" for lib in LIBS}:
                z.extract(name, into)
    return version, into / "torch"


def _cxx11_abi(lib: Path) -> bool:
    """Whether libc10 was built with the C++11 ABI (its symbols say so)."""
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return "B5cxx11" in syms


def main(argv: list[str]) -> int:
    out, wheels = Path(argv[0]), [Path(w) for w in argv[1:]]
    build = _build_module()
    with tempfile.TemporaryDirectory() as tmp:
        stand_in = Path(tmp) / "engine"
        stand_in.mkdir()
        empty = stand_in / "empty.c"
        empty.write_text("/* stands in for the engine when linking the shim */\n")
        subprocess.run(["cc", "-shared", "-x", "c", str(empty), "-o", str(stand_in / build.ENGINE_FILE)], check=True)
        for wheel in wheels:
            version, torch_dir = _unpack(wheel, Path(tmp) / wheel.stem)
            abi = _cxx11_abi(torch_dir / "lib" / "libc10.so")
            includes = [str(torch_dir / "include"), str(torch_dir / "include" / "torch" / "csrc" / "api" / "include")]
            dest = out / build.tag(version, abi) / "_shim.so"
            # Installed as site-packages/rustccl/_shims/<tag>/_shim.so.
            rpath = ["$ORIGIN/../../../torch/lib", "$ORIGIN/../.."]
            build.compile_against(ROOT / "csrc-shim", includes, [str(torch_dir / "lib")], build.cxx_std(version), abi,
                                  dest, stand_in, rpath)
            print(f"torch {version}: {dest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
