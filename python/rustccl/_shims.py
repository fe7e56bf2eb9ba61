"""Which C++ shim serves the running torch.

The shim (the ``c10d::Backend`` of rustccl) is compiled against one torch
release's headers and C++ ABI. A wheel carries the shim built against the
torch of its build, when that build saw one, and the shim's sources. At
import the running torch gets:

1. the prebuilt shim, when it was built for the same minor release (a
   patch release uses its minor's shim) and C++ ABI;
2. else a shim compiled once for this torch, cached per rustccl version,
   torch release and ABI under ``RUSTCCL_BUILD_CACHE_DIR`` (default
   ``~/.cache/rustccl``), under a file lock that the ranks of a job share.

``RUSTCCL_BUILD_SHIM=compile`` skips the prebuilt shim (tests use it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from . import _rustccl

MIN_TORCH = (2, 11)
_PKG = Path(__file__).resolve().parent
ENGINE_FILE = "_rustccl.abi3.so"

# The shim loaded into this process, for rustccl.info(): path, how
# ("prebuilt" / "compiled" / "cached") and the torch it was built for.
loaded: dict | None = None


def release(version: str) -> tuple[int, int, int]:
    """"2.15.0+cu130" -> (2, 15, 0); pre-release tags are dropped."""
    parts = []
    for p in version.split("+", 1)[0].split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple((parts + [0, 0, 0])[:3])


def _abi(torch: ModuleType) -> bool:
    return bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def sources() -> Path:
    """The shim's sources: in the wheel beside the package, else (a source
    checkout) the repository's csrc-shim/."""
    for d in (_PKG / "_shim_src", _PKG.parents[1] / "csrc-shim"):
        if (d / "backend.cpp").is_file():
            return d
    raise ImportError(f"rustccl: the C++ shim's sources are missing (looked in {_PKG / '_shim_src'})")


def prebuilt(torch: ModuleType) -> Path | None:
    """The wheel's shim, if it was built for this torch's minor release and ABI."""
    built = _rustccl.build_info()["torch"]
    path = _PKG / "_shim.so"
    if os.environ.get("RUSTCCL_BUILD_SHIM") == "compile" or not built or not path.is_file():
        return None
    same = release(built["version"])[:2] == release(str(torch.__version__))[:2] and built["cxx11_abi"] == _abi(torch)
    return path if same else None


def cache_dir(torch: ModuleType) -> Path:
    """Where this rustccl version keeps the shim it compiled for this torch."""
    base = os.environ.get("RUSTCCL_BUILD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rustccl")
    src = sources()
    digest = hashlib.sha256()
    for f in sorted(src.iterdir()):
        digest.update(f.name.encode() + f.read_bytes())
    r = ".".join(map(str, release(str(torch.__version__))))
    return Path(base) / f"rustccl-{_rustccl.__version__}-{digest.hexdigest()[:12]}" / f"torch-{r}-cxx11abi{int(_abi(torch))}"


def compiler() -> str:
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c):
            return shutil.which(c)
    raise ImportError(
        "rustccl: no C++ compiler (c++, g++ or clang++; or set CXX) to build its torch backend for this torch. "
        "Install one (for example `apt-get install g++`), or a torch release that this rustccl wheel carries a "
        "prebuilt shim for (rustccl.info() names it).")


def _std(torch: ModuleType) -> str:
    # torch 2.12's headers need C++20; 2.11's build as C++17.
    return "c++17" if release(str(torch.__version__))[:2] <= (2, 11) else "c++20"


def compile_shim(torch: ModuleType, dest: Path) -> None:
    """Compiles the shim against the running torch into ``dest/_shim.so``
    (each source in parallel, then one link), atomically."""
    from torch.utils import cpp_extension as ce

    cxx, src = compiler(), sources()
    flags = [f"-std={_std(torch)}", "-O2", "-fPIC", "-fvisibility=hidden", "-w",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(_abi(torch))}", f"-I{src}"] + [f"-I{i}" for i in ce.include_paths()]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        units = sorted(src.glob("*.cpp"))

        def one(cpp: Path) -> Path:
            obj = Path(tmp) / (cpp.stem + ".o")
            r = subprocess.run([cxx, *flags, "-c", str(cpp), "-o", str(obj)], capture_output=True, text=True)
            if r.returncode != 0:
                raise ImportError(f"rustccl: compiling {cpp.name} against torch {torch.__version__} failed:\n{r.stderr[-4000:]}")
            return obj

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = list(pool.map(one, units))
        lib_dirs = ce.library_paths()
        out = Path(tmp) / "_shim.so"
        link = [cxx, "-shared", "-o", str(out), *map(str, objects)] + [f"-L{d}" for d in lib_dirs]
        link += ["-lc10", "-ltorch_cpu", "-ltorch", f"-L{_PKG}", "-Wl,--no-as-needed", f"-l:{ENGINE_FILE}",
                 "-Wl,--as-needed", "-Wl,-rpath," + ":".join([*lib_dirs, str(_PKG)])]
        r = subprocess.run(link, capture_output=True, text=True)
        if r.returncode != 0:
            raise ImportError(f"rustccl: linking its torch backend failed:\n{r.stderr[-4000:]}")
        os.replace(out, dest / "_shim.so")


@contextlib.contextmanager
def _locked(dest: Path):
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def path_for(torch: ModuleType) -> tuple[Path, dict]:
    """The shim for the running torch (prebuilt, cached, or compiled now),
    and how it was found (what ``loaded`` then says)."""
    if release(str(torch.__version__))[:2] < MIN_TORCH:
        raise ImportError(f"rustccl needs torch >= {'.'.join(map(str, MIN_TORCH))}; this process imported torch "
                          f"{torch.__version__} (pip install -U torch)")
    p = prebuilt(torch)
    if p is not None:
        return p, {"path": str(p), "how": "prebuilt", "torch": _rustccl.build_info()["torch"]["version"]}
    dest = cache_dir(torch)
    how = "cached"
    with _locked(dest):
        if not (dest / "_shim.so").is_file():
            print(f"rustccl: compiling its torch backend for torch {torch.__version__} (once; cached in {dest})",
                  file=sys.stderr, flush=True)
            compile_shim(torch, dest)
            how = "compiled"
    return dest / "_shim.so", {"path": str(dest / "_shim.so"), "how": how, "torch": str(torch.__version__)}
