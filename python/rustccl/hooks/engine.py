"""DDP comm hook that compresses the exchange between hosts in the engine.

    ddp.register_comm_hook(None, rustccl.hooks.engine_compression("int8"))
    ddp.register_comm_hook(H.CommState(), rustccl.hooks.engine_compression("bf16"))

Unlike the other hooks, nothing is compressed in Python and the bucket is
one ordinary all-reduce (AVG): rustccl reduces exactly within each host and
encodes only what its host leaders send each other (see
:mod:`rustccl.compression`), with error feedback kept in the engine per
bucket (``bucket.index()``; the memory restarts when DDP rebuilds its
buckets, since their lengths change). Needs the rustccl backend; on one host,
or for non-float buckets, it is a plain all-reduce.
"""


import itertools

import torch
import torch.distributed as dist

from .. import _rustccl
from ..compression import CODECS
from ..stats import _group_name
from ._state import CommState

_ids = itertools.count()


def engine_compression(codec: str = "int8", error_feedback: bool = True):
    """A comm hook ``(state, bucket) -> Future`` averaging each bucket with
    `codec` ("bf16", "fp16", "int8" or "none") between hosts. `state` is a
    process group, None (default group) or a :class:`CommState` (bytes are
    counted as the all-reduce's input: the engine decides what crosses
    hosts; ``rustccl.stats()`` reports it)."""
    if codec not in CODECS:
        raise ValueError(f"rustccl.hooks.engine_compression: unknown codec {codec!r} (known: {', '.join(CODECS)})")
    hook_id = next(_ids)

    def hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group = state.group() if isinstance(state, CommState) else state
        buf = bucket.buffer()
        name = _group_name(group)
        _rustccl._compress_next(name, None if codec == "none" else codec, f"ddp{hook_id}:bucket{bucket.index()}", error_feedback)
        fut = dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=group, async_op=True).get_future()
        if isinstance(state, CommState):
            state.account(bucket, buf.numel() * buf.element_size())
        return fut.then(lambda f: f.value()[0])

    hook.__name__ = f"engine_compression_{codec}"
    return hook
