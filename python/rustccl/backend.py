"""Registration of the ``rustccl`` backend with ``torch.distributed``.

torch calls :func:`_create_backend` once per process group (the default
group and every ``new_group``) with the group's store, rank, size and
timeout. The Rust engine runs its rendezvous through that store, connects
to every peer, and the C++ shim wraps the resulting communicator in a
``c10d::Backend``; torch registers it for CPU and CUDA tensors.
"""

from __future__ import annotations

import atexit
import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroup

from . import _rustccl, _shims, tune
from ._rustccl import Communicator
from .options import Options

BACKEND_NAME = "rustccl"


def _store_host(store) -> str | None:
    """The host of the TCPStore behind ``store`` (through PrefixStores), or
    MASTER_ADDR: rustccl listens on the interface that reaches it."""
    s = store
    for _ in range(16):
        if isinstance(s, PrefixStore):
            s = s.underlying_store
        else:
            break
    host = getattr(s, "host", None)
    if isinstance(host, str) and host:
        return host
    return os.environ.get("MASTER_ADDR") or None


def _seconds(t) -> float:
    if isinstance(t, timedelta):
        return t.total_seconds()
    return float(t)


def _settings(backend_options) -> list[tuple[str, str]] | None:
    """The group's own settings from ``pg_options``: a rustccl.Options, or
    nothing (None, or torch's ``Backend.Options`` that a split passes)."""
    if backend_options is None or isinstance(backend_options, torch._C._distributed_c10d.Backend.Options):
        return None
    if isinstance(backend_options, Options):
        return backend_options.pairs()
    raise TypeError(f"rustccl: pg_options must be a rustccl.Options, got {type(backend_options).__name__}")


def new_process_group(store, rank: int, size: int, timeout, group: str,
                      options: Options | None = None) -> tuple[ProcessGroup, Communicator]:
    """A rustccl group of ``size`` ranks through ``store`` (every rank calls
    it with the same ``group`` name): a torch ``ProcessGroup`` with the
    rustccl backend for CPU and CUDA tensors, and the engine's communicator
    behind it (its error state and abort). For libraries that build their
    own process groups (``rustccl.torchft``); scripts use
    ``init_process_group("rustccl")``."""
    _load_shim()
    timeout_s = _seconds(timeout)
    settings = tune.settings_for(store, rank, size, group, _settings(options))
    comm = Communicator.bootstrap(store, rank, size, timeout_s, group, _store_host(store), settings)
    if comm.settings_warning:
        # ranks set apart (environment or pg_options) may later wait for
        # each other until the timeout: say so now, once per group
        warnings.warn(comm.settings_warning, RuntimeWarning, stacklevel=3)
    # init_process_group(device_id=cuda:i): torch then calls the backend's
    # eager_connect_single_device, which creates the NCCL communicator.
    boxed = torch.ops.rustccl._create_process_group(comm._into_raw(), rank, size, int(timeout_s * 1000))
    return ProcessGroup.unbox(boxed), comm


# The TLS settings the default group got through pg_options: torch's
# new_group passes no options of its own, and a group made from an
# encrypted one must not travel in clear.
_default_tls: list[tuple[str, str]] = []


def _with_default_tls(backend_options):
    pairs = _settings(backend_options) or []
    tls = [(k, v) for k, v in pairs if k.startswith("RUSTCCL_TLS")]
    if not dist.is_initialized():
        _default_tls[:] = tls
    elif not tls and _default_tls:
        return Options(dict(pairs + _default_tls))
    return backend_options


def _create_backend(opts, backend_options=None):
    group = str(opts.group_id) if opts.group_id is not None else "default"
    backend_options = _with_default_tls(backend_options)
    pg, _ = new_process_group(opts.store, opts.group_rank, opts.group_size, opts.timeout, group, backend_options)
    return pg._get_backend(torch.device("cpu"))


def _load_shim() -> None:
    """Loads the c10d shim for the running torch (it registers
    ``torch.ops.rustccl``); the only part of rustccl that links libtorch."""
    if _shims.loaded is not None:
        return
    path, how = _shims.path_for(torch)
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        raise ImportError(f"rustccl: cannot load its torch backend {path}: {e}") from e
    _shims.loaded = how


def use_shared_tensors() -> int:
    """Puts CPU tensors made from now on, of ``RUSTCCL_SHM_TENSORS_MIN_BYTES``
    or more, into memory the other ranks of this host map too, so rustccl's
    collectives and sends between them read those tensors with one copy in
    user space (``import rustccl`` calls it under ``RUSTCCL_SHM_TENSORS=1``).
    Call it before ``init_process_group``: groups made earlier read through
    the kernel as before. Idempotent; returns the smallest tensor size in
    bytes that goes to shared memory."""
    _load_shim()
    return int(torch.ops.rustccl._use_shared_tensors())


def register() -> None:
    """Registers the backend under the name ``"rustccl"`` (idempotent)."""
    _load_shim()
    plugins = getattr(dist.Backend, "_plugins", {})
    if BACKEND_NAME.upper() in plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])
    # A script that ends without destroy_process_group: stop the engines
    # (after the work already queued) while Python still runs, not while
    # the process destroys torch's C++ state around their threads.
    atexit.register(_rustccl._shutdown_all)
