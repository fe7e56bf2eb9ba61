"""What torch's Python layer keeps from plugin backends, made available for
rustccl groups: ``monitored_barrier`` and ``dist.split_group``; and
:func:`failed_ranks` for recovering with ``dist.shrink_group``.

- torch's ``dist.monitored_barrier`` refuses every backend but gloo by name;
  :func:`monitored_barrier` has its signature and runs rustccl's
  (c10d ``Backend::monitoredBarrier``, gloo's semantics).
- torch's ``dist.split_group`` reads ``parent_backend.options``, an attribute
  only torch's own backends expose to Python, and ``dist.new_group`` on a
  group bound to a device asks ranks outside the new group to call
  ``perform_nocolor_split``, which exists only on ``ProcessGroupNCCL``.
  :func:`install` wraps both so that, for rustccl groups only, split_group
  passes backend options and new_group skips the NCCL-only step (rustccl's
  new groups need no participation from non-members).
- torch's ``dist.shrink_group`` registers the new backend as torch's own
  GLOO (CPU) or NCCL (CUDA) backend type; DDP's logger then treats it as
  ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` and crashes. :func:`install`
  re-registers a rustccl shrunk group as a plugin backend (for CPU and CUDA
  tensors, like every rustccl group).

Other backends see torch's functions unchanged.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

BACKEND_NAME = "rustccl"


def _is_rustccl(pg) -> bool:
    try:
        return dist.get_backend(pg) == BACKEND_NAME
    except Exception:  # noqa: BLE001 - not a registered group
        return False


def monitored_barrier(group=None, timeout: timedelta | float | None = None, wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for rustccl groups.

    Rank 0 waits up to ``timeout`` (default: the group's timeout) for every
    other rank and raises ``DistBackendError`` naming the first rank that did
    not arrive ("Rank 1 failed to pass monitoredBarrier in 1000 ms"), or
    every one with ``wait_all_ranks=True``; the other ranks learn the outcome
    from rank 0 and raise too. After a successful call the group is usable
    as before. Works on subgroups (their rank 0).
    """
    if c10d._rank_not_in_group(group):
        c10d._warn_not_in_group("monitored_barrier")
        return
    pg = c10d._get_default_group() if group is None else group
    if not _is_rustccl(pg):
        raise ValueError(
            f"rustccl.monitored_barrier: the group's backend is {dist.get_backend(pg)!r}; "
            "use torch.distributed.monitored_barrier for gloo groups"
        )
    if isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    if timeout is None:
        pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
    else:
        pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def failed_ranks(group=None) -> list[int]:
    """Ranks of ``group`` (group ranks) whose link to this rank broke under
    an operation: the dead ranks, as this rank saw them. After a collective
    failed because a rank died, the survivors pass this to
    ``dist.shrink_group`` (which checks that they all pass the same list)."""
    from . import _rustccl
    from .stats import _group_name

    return list(_rustccl._failed_ranks(_group_name(group)))


def install() -> None:
    """Wraps torch's ``split_group`` and ``_get_split_source`` for rustccl
    groups (idempotent; see the module docs)."""
    if getattr(c10d._get_split_source, "_rustccl", False):
        return

    torch_split_source = c10d._get_split_source

    @functools.wraps(torch_split_source)
    def _get_split_source(pg):
        source = torch_split_source(pg)
        if source is not None and source.name() == BACKEND_NAME:
            return None
        return source

    _get_split_source._rustccl = True
    c10d._get_split_source = _get_split_source

    torch_split_group = c10d.split_group

    @functools.wraps(torch_split_group)
    def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None):
        parent = parent_pg if parent_pg is not None else (c10d._get_default_group() if dist.is_initialized() else None)
        from .options import Options

        if isinstance(pg_options, Options):
            raise ValueError("rustccl: split_group's groups keep the parent group's settings; "
                             "pass rustccl.Options to init_process_group or new_group")
        if pg_options is None and parent is not None and _is_rustccl(parent):
            t = timeout if timeout is not None else c10d._get_default_timeout(BACKEND_NAME)
            pg_options = torch._C._distributed_c10d.Backend.Options(BACKEND_NAME, t)
        return torch_split_group(parent_pg, split_ranks, timeout, pg_options, group_desc)

    split_group._rustccl = True
    c10d.split_group = split_group
    dist.split_group = split_group

    torch_create_shrunk = c10d._create_shrunk_process_group

    @functools.wraps(torch_create_shrunk)
    def _create_shrunk_process_group(new_backend, *args, **kwargs):
        pg = torch_create_shrunk(new_backend, *args, **kwargs)
        if new_backend.name() == BACKEND_NAME:
            custom = c10d.ProcessGroup.BackendType.CUSTOM
            for device in ("cpu", "cuda"):
                pg._register_backend(torch.device(device), custom, new_backend)
            pg._set_default_backend(custom)
        return pg

    c10d._create_shrunk_process_group = _create_shrunk_process_group

    torch_new_pg = c10d._new_process_group_helper

    @functools.wraps(torch_new_pg)
    def _new_process_group_helper(*args, **kwargs):
        out = torch_new_pg(*args, **kwargs)
        _default_to_rustccl(out[0], kwargs.get("backend", args[3] if len(args) > 3 else None))
        return out

    c10d._new_process_group_helper = _new_process_group_helper


def _default_to_rustccl(pg, backend) -> None:
    """With a device spec such as "cpu:rustccl", torch looks for the plugin
    under its lower-case name among upper-case keys and leaves the group
    without a default backend, which it then warns of at destroy: make
    rustccl the default where it is the group's only backend."""
    if type(pg) is not c10d.ProcessGroup or backend is None or ":" not in str(backend):
        return
    chosen = set(c10d.BackendConfig(backend).get_device_backend_map().values())
    if chosen == {BACKEND_NAME}:
        pg._set_default_backend(c10d.ProcessGroup.BackendType.CUSTOM)
