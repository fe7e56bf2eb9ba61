"""Compiling the C++ shim against one torch's headers and libraries.

Needs neither torch nor the engine, so that ``scripts/prebuild_shims.py``
can build shims for torch releases that are only unpacked, not installed;
``rustccl._shims`` uses it to compile one for the running torch.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ENGINE_FILE = "_rustccl.abi3.so"


def release(version: str) -> tuple[int, int, int]:
    """"2.15.0+cu130" -> (2, 15, 0); pre-release tags are dropped."""
    parts = []
    for p in version.split("+", 1)[0].split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple((parts + [0, 0, 0])[:3])


def compiler() -> str:
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c):
            return shutil.which(c)
    raise ImportError(
        "rustccl: no C++ compiler (c++, g++ or clang++; or set CXX) to build its torch backend for this torch. "
        "Install one (for example `apt-get install g++`), or a torch release that this rustccl wheel carries a "
        "prebuilt shim for (rustccl.info() names it).")


def cxx_std(version: str) -> str:
    """torch 2.12's headers need C++20; 2.11's build as C++17."""
    return "c++17" if release(version)[:2] <= (2, 11) else "c++20"


def tag(version: str, abi: bool) -> str:
    """The name of the prebuilt shim for a torch minor release and ABI."""
    major, minor, _ = release(version)
    return f"torch{major}.{minor}-cxx11abi{int(abi)}"


def compile_against(src: Path, includes: list[str], lib_dirs: list[str], std: str, abi: bool, out: Path,
                    engine_dir: Path, rpath: list[str]) -> None:
    """Compiles the shim's sources against one torch's headers and links
    them to its libraries and to the engine (found by its soname at run
    time), into ``out``: each source in parallel, then one link, written
    atomically."""
    cxx = compiler()
    flags = [f"-std={std}", "-O2", "-fPIC", "-fvisibility=hidden", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(abi)}",
             f"-I{src}"] + [f"-I{i}" for i in includes]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:

        def one(cpp: Path) -> Path:
            obj = Path(tmp) / (cpp.stem + ".o")
            r = subprocess.run([cxx, *flags, "-c", str(cpp), "-o", str(obj)], capture_output=True, text=True)
            if r.returncode != 0:
                raise ImportError(f"rustccl: compiling the shim's {cpp.name} failed:\n{r.stderr[-4000:]}")
            return obj

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = list(pool.map(one, sorted(src.glob("*.cpp"))))
        lib = Path(tmp) / out.name
        link = [cxx, "-shared", "-o", str(lib), *map(str, objects)] + [f"-L{d}" for d in lib_dirs]
        link += ["-lc10", "-ltorch_cpu", "-ltorch", f"-L{engine_dir}", "-Wl,--no-as-needed", f"-l:{ENGINE_FILE}",
                 "-Wl,--as-needed", "-Wl,-rpath," + ":".join(rpath)]
        r = subprocess.run(link, capture_output=True, text=True)
        if r.returncode != 0:
            raise ImportError(f"rustccl: linking the shim failed:\n{r.stderr[-4000:]}")
        os.replace(lib, out)
