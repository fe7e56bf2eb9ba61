"""Which C++ shim serves the running torch.

The shim (the ``c10d::Backend`` of rustccl) is compiled against one torch
release's headers and C++ ABI. A wheel carries the shim built against the
torch of its build (when that build saw one), shims prebuilt for other
releases (``scripts/prebuild_shims.py``), and the shim's sources. At
import the running torch gets:

1. a prebuilt shim, when one was built for the same minor release (a
   patch release uses its minor's shim) and C++ ABI;
2. else a shim compiled once for this torch, cached per rustccl version,
   torch release and ABI under ``RUSTCCL_BUILD_CACHE_DIR`` (default
   ``~/.cache/rustccl``), under a file lock that the ranks of a job share.

``RUSTCCL_BUILD_SHIM=compile`` skips the prebuilt shim (tests use it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
from pathlib import Path
from types import ModuleType

from . import _rustccl
from ._shim_build import compile_against, cxx_std, release, tag

MIN_TORCH = (2, 11)
_PKG = Path(__file__).resolve().parent

# The shim loaded into this process, for rustccl.info(): path, how
# ("prebuilt" / "compiled" / "cached") and the torch it was built for.
loaded: dict | None = None


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
    """A shim of the wheel built for this torch's minor release and ABI: the
    one built against the building torch, or one of those prebuilt for
    other releases (``rustccl/_shims/<tag>/``, empty where the build had
    none)."""
    if os.environ.get("RUSTCCL_BUILD_SHIM") == "compile":
        return None
    version, abi = str(torch.__version__), _abi(torch)
    built = _rustccl.build_info()["torch"]
    path = _PKG / "_shim.so"
    if built and path.is_file() and tag(built["version"], built["cxx11_abi"]) == tag(version, abi):
        return path
    other = _PKG / "_shims" / tag(version, abi) / "_shim.so"
    return other if other.is_file() and other.stat().st_size > 0 else None


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


def compile_shim(torch: ModuleType, dest: Path) -> None:
    """Compiles the shim against the running torch into ``dest/_shim.so``."""
    from torch.utils import cpp_extension as ce

    libs = ce.library_paths()
    compile_against(sources(), ce.include_paths(), libs, cxx_std(str(torch.__version__)), _abi(torch),
                    dest / "_shim.so", _PKG, [*libs, str(_PKG)])


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
        return p, {"path": str(p), "how": "prebuilt", "torch": str(torch.__version__)}
    dest = cache_dir(torch)
    how = "cached"
    with _locked(dest):
        if not (dest / "_shim.so").is_file():
            print(f"rustccl: compiling its torch backend for torch {torch.__version__} (once; cached in {dest})",
                  file=sys.stderr, flush=True)
            compile_shim(torch, dest)
            how = "compiled"
    return dest / "_shim.so", {"path": str(dest / "_shim.so"), "how": how, "torch": str(torch.__version__)}
