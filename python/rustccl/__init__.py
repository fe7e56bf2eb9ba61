"""rustccl: a ``torch.distributed`` backend with a Rust engine.

Usage::

    import rustccl                      # registers the "rustccl" backend
    import torch.distributed as dist
    dist.init_process_group("rustccl")  # under torchrun, or with tcp:// / file://

Every collective on CPU tensors then runs over rustccl's own transport.
``rustccl.Communicator`` runs the same collectives on numpy arrays (any
DLPack-capable CPU array) without torch.distributed.
"""

# torch, when installed, must be the torch this build was compiled against
# (checked before the torch backend's shim loads); without torch,
# Communicator works and only the backend is unavailable.
from ._torch_check import import_torch

_torch = import_torch()

from . import _rustccl
from ._rustccl import Communicator, __version__, host_identity
from .compression import compression, set_compression
from .info import info
from .options import Options, config
from .stats import flight_record, reset_stats, stats
from .store import FileStore

if _torch is not None:
    from .backend import BACKEND_NAME, register, use_shared_tensors
    from .groups import install as _install_torch_compat
    from .groups import failed_ranks, monitored_barrier

    register()
    _install_torch_compat()
    # Not config(): that reads every setting once per process, and a
    # script may set some after this import.
    if _rustccl._shm_tensors_requested():
        use_shared_tensors()
else:
    from ._torch_check import BACKEND_NAME, failed_ranks, monitored_barrier, register, use_shared_tensors

__all__ = [
    "BACKEND_NAME",
    "Communicator",
    "compression",
    "FileStore",
    "Options",
    "__version__",
    "config",
    "failed_ranks",
    "flight_record",
    "host_identity",
    "info",
    "monitored_barrier",
    "register",
    "reset_stats",
    "set_compression",
    "stats",
    "use_shared_tensors",
]
