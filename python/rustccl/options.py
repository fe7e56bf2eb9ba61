"""A rustccl process group's own settings, for ``pg_options``.

Collective thresholds and the shared-memory transport's sizes are read from
``RUSTCCL_*`` environment variables once per process; :class:`Options`
gives one group different ones, e.g. to time two settings against each
other in one process (``python -m rustccl.bench --variant``) or to keep a
latency-bound group apart from a bandwidth-bound one::

    fast = dist.new_group(backend="rustccl",
                          pg_options=rustccl.Options(RUSTCCL_SHM_SLOT_MIN_BYTES="1M"))
"""

from __future__ import annotations

from collections.abc import Mapping

from . import _rustccl


class Options:
    """``RUSTCCL_*`` settings of one process group, over the environment.

    Names and values are those of the environment (``rustccl.config()``
    lists them). A group may set the host algorithms' thresholds
    (``RUSTCCL_SMALL_ALLREDUCE_BYTES``, ``RUSTCCL_SMALL_BROADCAST_BYTES``,
    ``RUSTCCL_SEGMENT_BYTES``, ``RUSTCCL_CALLER_RUNS_US``),
    ``RUSTCCL_TRANSPORT``, ``RUSTCCL_CHECK`` and the shared-memory settings
    (``RUSTCCL_SHM_*`` but the shared tensor arena's); the others apply to
    the whole process, and creating the group with one of them, an unknown
    name or a value that does not parse raises an error naming it. Every
    rank of the group must pass the same settings. ``rustccl.stats(group)``
    shows them under ``settings`` and ``rustccl.config(group)`` every
    setting's value in the group; groups split or shrunk from the group
    keep them.

    Pass them to ``dist.init_process_group`` or ``dist.new_group`` as
    ``pg_options``.
    """

    def __init__(self, settings: Mapping[str, object] | None = None, **kwargs: object) -> None:
        merged = dict(settings or {})
        merged.update(kwargs)
        self.settings: dict[str, str] = {}
        for name, value in merged.items():
            if not isinstance(name, str):
                raise TypeError(f"rustccl.Options: setting names are strings, got {name!r}")
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, (str, int)):
                raise TypeError(f"rustccl.Options: {name} must be a string or an int, got {type(value).__name__}")
            self.settings[name] = str(value)

    def pairs(self) -> list[tuple[str, str]]:
        """The settings as (name, value) pairs, in the order given."""
        return list(self.settings.items())

    def __repr__(self) -> str:
        return f"rustccl.Options({self.settings!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and other.settings == self.settings

    __hash__ = None  # type: ignore[assignment] - mutable


def config(group=None) -> dict[str, dict[str, str]]:
    """Every ``RUSTCCL_*`` setting: ``{name: {"value", "default", "doc"}}``,
    the values this process reads; with ``group`` (a process group or its
    name), the values in force in that rustccl group: its own settings
    (:class:`Options`) over the process's."""
    if group is None:
        return _rustccl.config()
    from .stats import _group_name

    return _rustccl.config(_group_name(group))
