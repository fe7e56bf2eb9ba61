"""torch, if installed, and stand-ins for the backend's functions without it.

The extension (``rustccl._rustccl``) links no libtorch: the numpy
``Communicator`` works without torch. The torch backend is a second library,
the C++ shim, compiled against one torch release's headers and C++ ABI;
``rustccl._shims`` picks or compiles the one for the running torch.
"""

from __future__ import annotations

from types import ModuleType
from typing import NoReturn

from . import _rustccl

BACKEND_NAME = "rustccl"


def built_with() -> dict | None:
    """The torch the wheel's prebuilt shim was compiled against: version,
    CUDA flavour (None for a CPU-only torch), C++ ABI flag; None when the
    build saw no torch (every torch then gets a shim compiled on import)."""
    return _rustccl.build_info()["torch"]


def import_torch() -> ModuleType | None:
    """torch, when installed (a release this rustccl supports); None when
    torch is not installed. Which shim serves it is chosen when the backend
    loads (``rustccl._shims``)."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name == "torch":
            return None
        raise
    from ._shims import MIN_TORCH, release

    if release(str(torch.__version__))[:2] < MIN_TORCH:
        raise ImportError(
            f"rustccl {_rustccl.__version__} needs torch >= {'.'.join(map(str, MIN_TORCH))}, but this process "
            f"imported torch {torch.__version__}: pip install -U torch")
    return torch


def _needs_torch(what: str) -> NoReturn:
    raise ImportError(
        f"rustccl: {what} needs torch (>= 2.11), which is not installed "
        f"(pip install torch); rustccl.Communicator works without it."
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
