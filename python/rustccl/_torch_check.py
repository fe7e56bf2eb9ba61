"""The torch this build of rustccl needs, checked before its shim loads.

The extension (``rustccl._rustccl``) links no libtorch: the numpy
``Communicator`` works without torch. The torch backend is a second library,
``rustccl/_shim.so``, compiled against one torch's headers and C++ ABI; it
may only be loaded into a process whose torch is that version.
"""

from __future__ import annotations

from types import ModuleType
from typing import NoReturn

from . import _rustccl

BACKEND_NAME = "rustccl"


def built_with() -> dict:
    """The torch this build was compiled against: version, CUDA flavour
    (None for a CPU-only torch), C++ ABI flag."""
    return _rustccl.build_info()["torch"]


def _release(version: str) -> str:
    """"2.11.0+cu130" -> "2.11.0": the local tag names the CUDA flavour,
    which the shim does not depend on (it links no CUDA library)."""
    return version.split("+", 1)[0]


def mismatch(running_version: str, running_abi: bool | None) -> str | None:
    """Why a torch of `running_version` (C++ ABI flag `running_abi`) cannot
    load this build's shim, or None when it can."""
    built = built_with()
    if _release(running_version) != _release(built["version"]):
        return (
            f"rustccl {_rustccl.__version__} was built against torch {built['version']}, "
            f"but this process imported torch {running_version}"
        )
    if running_abi is not None and running_abi != built["cxx11_abi"]:
        return (
            f"rustccl {_rustccl.__version__} was built against a torch with _GLIBCXX_USE_CXX11_ABI="
            f"{int(built['cxx11_abi'])}, but torch {running_version} uses {int(running_abi)}"
        )
    return None


def how_to_fix() -> str:
    want = _release(built_with()["version"])
    return (
        f"Install the torch it needs (pip install torch=={want}), or build rustccl against your torch: "
        f"set the torch== pin in rustccl's pyproject.toml to your version and run "
        f"`pip install --no-build-isolation .` in its source tree (needs Rust and a C++ compiler)."
    )


def import_torch() -> ModuleType | None:
    """torch, when installed and the version this build needs; None when
    torch is not installed. Raises ImportError for any other torch."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name == "torch":
            return None
        raise
    abi = getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
    why = mismatch(str(torch.__version__), None if abi is None else bool(abi))
    if why is not None:
        raise ImportError(f"{why}: its torch backend cannot load. {how_to_fix()}")
    return torch


def _needs_torch(what: str) -> NoReturn:
    want = _release(built_with()["version"])
    raise ImportError(
        f"rustccl: {what} needs torch=={want}, which is not installed "
        f"(pip install torch=={want}); rustccl.Communicator works without it."
    )


def register() -> NoReturn:
    """Stands in for ``rustccl.register`` when torch is not installed."""
    _needs_torch("the torch.distributed backend")


def monitored_barrier(*args: object, **kwargs: object) -> NoReturn:
    """Stands in for ``rustccl.monitored_barrier`` when torch is not installed."""
    _needs_torch("monitored_barrier")


def failed_ranks(*args: object, **kwargs: object) -> NoReturn:
    """Stands in for ``rustccl.failed_ranks`` when torch is not installed."""
    _needs_torch("failed_ranks")


def use_shared_tensors() -> NoReturn:
    """Stands in for ``rustccl.use_shared_tensors`` when torch is not installed."""
    _needs_torch("use_shared_tensors")
