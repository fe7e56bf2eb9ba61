"""8-bit quantisation with a scale per chunk, error feedback optional.

Each parameter's gradient is cut into chunks of ``QuantState.chunk_size``
entries (the last one shorter); a chunk is sent as int8 values
``round(x / s)`` with ``s = max|x| / 127`` and one float32 scale, so a float32
bucket shrinks about 4x (2x for half precision). Chunks never straddle two
parameters: each parameter gets scales fitted to its own magnitudes, and
its compression does not depend on which bucket DDP put it in (DDP
regroups buckets after its first iteration and after every restart).

Ranks use different scales, so int8 values cannot be summed by an
all-reduce (it would also overflow): values and scales are all-gathered
and every rank dequantises and averages. Rounding error is at most
``s / 2`` per entry; with error feedback it is carried into the next step
instead of lost.
"""

from typing import Optional

import torch
import torch.distributed as dist

from ._state import CommState, pack, unpack


class QuantState(CommState):
    """Configuration and memory of :func:`int8_hook`."""

    chunk_size = 2048
    """Entries per scale: smaller tracks local magnitudes better, costs 4
    bytes more per chunk."""

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, use_error_feedback: bool = True):
        super().__init__(process_group)
        self.use_error_feedback = use_error_feedback


def _pad(x: torch.Tensor, sizes: list[int], chunk: int) -> torch.Tensor:
    """x (..., sum(sizes)) with every segment zero-padded to whole chunks."""
    pieces, off = [], 0
    for k in sizes:
        pieces.append(x[..., off:off + k])
        if k % chunk:
            pieces.append(x.new_zeros(*x.shape[:-1], chunk - k % chunk))
        off += k
    return torch.cat(pieces, dim=-1)


def _unpad(x: torch.Tensor, sizes: list[int], chunk: int) -> torch.Tensor:
    """The inverse of :func:`_pad`."""
    pieces, off = [], 0
    for k in sizes:
        pieces.append(x[..., off:off + k])
        off += -(-k // chunk) * chunk
    return torch.cat(pieces, dim=-1)


def int8_hook(state: QuantState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket sent as int8 with per-chunk scales (see the
    module docstring). One all-gather per bucket, issued from the hook call."""
    group, world = state.group(), state.world_size()
    buf = bucket.buffer()
    n, chunk = buf.numel(), state.chunk_size
    if state.use_error_feedback:
        state.add_error(bucket, buf)
    sizes = [p.numel() for p in bucket.parameters()]
    x = _pad(buf.float(), sizes, chunk).view(-1, chunk)
    scale = x.abs().amax(dim=1, keepdim=True).div_(127).clamp_min_(torch.finfo(torch.float32).tiny)
    q = x.div_(scale).round_().clamp_(-127, 127)
    if state.use_error_feedback:
        state.set_flat_memory(bucket, "error", buf - _unpad(q.mul(scale).view(-1), sizes, chunk).to(buf.dtype))

    payload = pack(_unpad(q.view(-1), sizes, chunk).to(torch.int8), scale)  # [int8 values | float32 scales]
    gathered = torch.empty(world * payload.numel(), dtype=torch.uint8, device=buf.device)
    fut = dist.all_gather_into_tensor(gathered, payload, group=group, async_op=True).get_future()
    state.account(bucket, payload.numel())

    def decompress(f: torch.futures.Future) -> torch.Tensor:
        f.wait()
        rows = gathered.view(world, -1)
        values = _pad(rows[:, :n].view(torch.int8).float(), sizes, chunk).view(world, -1, chunk)
        scales = unpack(rows[:, n:], torch.float32).view(world, -1, 1)
        avg = _unpad(values.mul_(scales).sum(dim=0).view(-1), sizes, chunk).div_(world)
        return buf.copy_(avg)

    return fut.then(decompress)
