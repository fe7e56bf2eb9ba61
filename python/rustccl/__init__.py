"""rustccl: a ``torch.distributed`` backend with a Rust engine.

Usage::

    import rustccl                      # registers the "rustccl" backend
    import torch.distributed as dist
    dist.init_process_group("rustccl")  # under torchrun, or with tcp:// / file://

Every collective on CPU tensors then runs over rustccl's own transport.
``rustccl.Communicator`` runs the same collectives on numpy arrays (any
DLPack-capable CPU array) without torch.distributed.
"""

# torch first: the extension links libtorch and registers its c10d shim
# with torch's dispatcher when it loads.
import torch  # noqa: F401

from . import _rustccl
from ._rustccl import Communicator, __version__, config, host_identity
from .backend import BACKEND_NAME, register
from .compression import compression, set_compression
from .stats import flight_record, reset_stats, stats
from .store import FileStore

register()

__all__ = [
    "BACKEND_NAME",
    "Communicator",
    "compression",
    "FileStore",
    "__version__",
    "config",
    "flight_record",
    "host_identity",
    "register",
    "reset_stats",
    "set_compression",
    "stats",
]
