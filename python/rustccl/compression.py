"""Compression of the all-reduce between hosts, inside the engine.

    rustccl.set_compression(group, "int8")     # or "bf16", "fp16"; None turns it off
    rustccl.compression(group)                 # -> ("int8", True) or None

For groups spanning several hosts, rustccl reduces within each host through
shared memory (exact), lets one leader per host exchange the host's partial
sum over TCP, and broadcasts within the host. With a codec set, the leaders
exchange encoded partial sums instead: ``bf16`` / ``fp16`` (casts, half the
bytes of float32) or ``int8`` (one float32 scale per 256 values, about a
quarter). Every leader decodes the same bytes in the same order, so all
ranks get bitwise identical results. Only SUM / AVG all-reduces of float
tensors compress; other ops and dtypes, and groups on one host, stay exact.

With ``error_feedback`` (default), each leader keeps what rounding lost for
each tensor (keyed by its address, length and dtype; reset when they
change) and adds it to the next all-reduce of that tensor, so the running
sum of results tracks the running sum of inputs. For DDP, use the comm hook
:func:`rustccl.hooks.engine_compression`, which keys the memory by bucket.

Every rank of the group must make the same call at the same point.
"""

from __future__ import annotations

from . import _rustccl
from .stats import _group_name

CODECS = ("none", "bf16", "fp16", "int8")


def set_compression(group=None, codec: str | None = "int8", error_feedback: bool = True) -> None:
    """Compresses the later float SUM / AVG all-reduces of `group` (a
    ProcessGroup, its name, or None for the default group) between hosts
    with `codec` ("bf16", "fp16", "int8"; None or "none" for exact)."""
    _rustccl._set_compression(_group_name(group), codec, error_feedback)


def compression(group=None):
    """(codec, error_feedback) of `group`, or None when exact."""
    return _rustccl._compression(_group_name(group))
