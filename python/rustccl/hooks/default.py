"""Lossless and cast-based comm hooks: plain average, fp16, bf16.

The state is a process group or ``None`` (the default group), as with
torch's own default hooks, or a :class:`~rustccl.hooks.CommState` to also
count the bytes sent.
"""

from typing import Any

import torch
import torch.distributed as dist

from ._state import resolve


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket with one all-reduce: what DDP does without a hook.

    Divides by the world size first and sums, rather than asking for
    ``ReduceOp.AVG``, so it works on every backend (gloo has no AVG)."""
    group, acct = resolve(state)
    buf = bucket.buffer()
    buf.div_(dist.get_world_size(group))
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    if acct is not None:
        acct.account(bucket, buf.numel() * buf.element_size())
    return fut.then(lambda f: f.value()[0])


def _cast_hook(dtype: torch.dtype, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group, acct = resolve(state)
    buf = bucket.buffer()
    # Divide before casting: a sum of world values each below max/world
    # cannot overflow fp16 (whose max is 65504), a sum of raw values can.
    buf.div_(dist.get_world_size(group))
    compressed = buf.to(dtype)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()
    if acct is not None:
        acct.account(bucket, compressed.numel() * compressed.element_size())

    def decompress(f: torch.futures.Future) -> torch.Tensor:
        buf.copy_(f.value()[0])  # in place: no second full-precision buffer
        return buf

    return fut.then(decompress)


def fp16_compress_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sends the bucket as float16 (half the bytes of float32), averages, and
    writes the result back into the bucket in its own dtype."""
    return _cast_hook(torch.float16, state, bucket)


def bf16_compress_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Like :func:`fp16_compress_hook` with bfloat16: float32's exponent
    range (no overflow), 8 bits of mantissa."""
    return _cast_hook(torch.bfloat16, state, bucket)
