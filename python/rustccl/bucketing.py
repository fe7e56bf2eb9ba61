"""Gradient bucketing for training loops without DDP.

    bucketer = GradientBucketer(model)              # bucket size measured
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()             # buckets all-reduce as they fill
        bucketer.wait()                             # averaged gradients in p.grad
        opt.step()

or ``with bucketer: loss.backward()``, which waits on leaving the block.
Gradient accumulation works as with DDP: backward passes inside
``with bucketer.no_sync():`` only accumulate ``p.grad`` locally, and the next
backward outside it communicates the accumulated gradients.

Parameters are packed, in reverse registration order (roughly the order in
which backward produces their gradients), into flat buckets of about
``bucket_cap_mb``. A post-accumulate-grad hook on each parameter copies its
gradient into its bucket; when a bucket is full its async all-reduce (or a
comm hook from :mod:`rustccl.hooks`) starts at once, so communication
overlaps the rest of backward. Buckets start strictly in index order, as in
DDP, so every rank issues the same collectives in the same order even when
gradients arrive in a different order.

With ``bucket_cap_mb=None`` the size comes from the group itself: a few
all-reduces of two sizes give latency alpha and per-byte time beta
(t(n) = alpha + beta n), and a bucket is made large enough that latency is at
most 5% of its all-reduce time, clamped to [1 MiB, 64 MiB].
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from .hooks import allreduce_hook

logger = logging.getLogger("rustccl.bucketing")

LATENCY_FRACTION = 0.05
MIN_BUCKET_BYTES = 1 << 20
MAX_BUCKET_BYTES = 64 << 20
_PROBES = ((4 << 10, 25), (8 << 20, 5))  # (bytes, timed repetitions)


def measure_alpha_beta(group: dist.ProcessGroup | None = None,
                       device: torch.device | str = "cpu") -> tuple[float, float]:
    """(alpha seconds, beta seconds per byte) of float32 all-reduce on
    ``group``, fitted through the median times of a small and a large
    message (a few tens of milliseconds in all on a CPU). The medians are
    averaged over the ranks, so every rank derives the same bucket layout."""
    device = torch.device(device)
    times = []
    for nbytes, reps in _PROBES:
        x = torch.zeros(nbytes // 4, device=device)
        samples = []
        for i in range(reps + 2):
            t0 = time.perf_counter()
            dist.all_reduce(x, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:  # the first two warm up connections and allocators
                samples.append(time.perf_counter() - t0)
        times.append(statistics.median(samples))
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    (n1, _), (n2, _) = _PROBES
    t1, t2 = (t / dist.get_world_size(group)).tolist()
    beta = (t2 - t1) / (n2 - n1)
    if beta <= 0:  # noise swamped the difference: charge all time to bandwidth
        beta = t2 / n2
    return max(t1 - beta * n1, 0.0), beta


def choose_bucket_bytes(alpha: float, beta: float) -> int:
    """Smallest bucket whose latency is at most LATENCY_FRACTION of its
    all-reduce time (alpha <= f (alpha + beta n)), clamped to
    [MIN_BUCKET_BYTES, MAX_BUCKET_BYTES]. Smaller buckets would start
    communicating sooner but pay latency too often."""
    n = alpha * (1 - LATENCY_FRACTION) / (LATENCY_FRACTION * beta)
    return int(min(max(n, MIN_BUCKET_BYTES), MAX_BUCKET_BYTES))


class _Bucket:
    """One flat buffer for some parameters' gradients, with the
    ``dist.GradBucket`` interface that comm hooks use."""

    def __init__(self, index: int, params: list[nn.Parameter]):
        self._index = index
        self._params = params
        self._buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self._views, off = [], 0
        for p in params:
            self._views.append(self._buffer[off:off + p.numel()].view_as(p))
            off += p.numel()
        self._last = False
        self.filled = [False] * len(params)

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def parameters(self) -> list[nn.Parameter]:
        return self._params

    def is_last(self) -> bool:
        return self._last

    def ready(self) -> bool:
        return all(self.filled)


class GradientBucketer:
    """Averages the gradients of ``model`` (an ``nn.Module`` or parameters)
    over ``group`` in flat buckets, overlapped with backward (see the
    module docstring).

    ``hook`` replaces the plain average: a comm hook ``fn(state, bucket)``
    from :mod:`rustccl.hooks` (called with ``state=group``), or a pair
    ``(state, fn)``, e.g. ``(TopKState(ratio=0.01), topk_hook)``.

    After construction ``bucket_cap_bytes`` holds the bucket size and,
    when it was measured, ``alpha_s`` and ``beta_s_per_byte`` the fit.
    """

    def __init__(self, model: nn.Module | Iterable[torch.Tensor], group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float | None = None,
                 hook: Callable | tuple[Any, Callable] | None = None):
        params = model.parameters() if isinstance(model, nn.Module) else model
        self.params = list({id(p): p for p in params if p.requires_grad}.values())
        if not self.params:
            raise ValueError("GradientBucketer: no parameters that require grad")
        self.group = group
        self.alpha_s = self.beta_s_per_byte = None
        if bucket_cap_mb is None:
            self.alpha_s, self.beta_s_per_byte = measure_alpha_beta(group, self.params[0].device)
            self.bucket_cap_bytes = choose_bucket_bytes(self.alpha_s, self.beta_s_per_byte)
        else:
            self.bucket_cap_bytes = max(1, int(bucket_cap_mb * (1 << 20)))
        if hook is None:
            self._state, self._hook = group, allreduce_hook
        elif isinstance(hook, tuple):
            self._state, self._hook = hook
        else:
            self._state, self._hook = group, hook
        self.buckets = self._assign()
        self._futures: list[torch.futures.Future | None] = [None] * len(self.buckets)
        self._next = 0
        self._sync = True
        self._handles = [self._register(b, i) for b in self.buckets for i in range(len(b.parameters()))]
        logger.info("%r", self)

    def _assign(self) -> list[_Bucket]:
        """Reverse registration order, one open bucket per (device, dtype);
        a bucket closes when it reaches the cap. Indices follow the order in
        which buckets were opened, i.e. the expected order of readiness."""
        groups: list[list[nn.Parameter]] = []
        sizes: list[int] = []
        open_: dict[tuple, int] = {}  # (device, dtype) -> index of its open bucket
        for p in reversed(self.params):
            key = (p.device, p.dtype)
            if key not in open_:
                open_[key] = len(groups)
                groups.append([])
                sizes.append(0)
            i = open_[key]
            groups[i].append(p)
            sizes[i] += p.numel() * p.element_size()
            if sizes[i] >= self.bucket_cap_bytes:
                del open_[key]
        buckets = [_Bucket(i, ps) for i, ps in enumerate(groups)]
        buckets[-1]._last = True
        return buckets

    def _register(self, bucket: _Bucket, i: int):
        param, view = bucket.parameters()[i], bucket.gradients()[i]

        def on_grad(p: torch.Tensor) -> None:
            if not self._sync:
                return  # accumulating: p.grad keeps the sum, sent after no_sync()
            if bucket.filled[i]:
                raise RuntimeError("GradientBucketer: a gradient arrived twice before wait(); call wait() "
                                   "after every synchronised backward, and run the backward passes that only "
                                   "accumulate gradients inside no_sync()")
            view.copy_(p.grad)
            bucket.filled[i] = True
            if bucket.ready():
                self._launch_ready()

        return param.register_post_accumulate_grad_hook(on_grad)

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].ready():
            self._futures[self._next] = self._hook(self._state, self.buckets[self._next])
            self._next += 1

    def wait(self) -> None:
        """Finishes the step: starts buckets that are still incomplete (a
        parameter that got no gradient in this backward counts with what
        ``p.grad`` holds, zero if it is None), waits
        for every bucket and writes the averaged gradients to ``p.grad``.
        Inside :meth:`no_sync` there is nothing to wait for: it returns."""
        if not self._sync:
            return
        for b in self.buckets[self._next:]:
            for i, (p, view) in enumerate(zip(b.parameters(), b.gradients())):
                if not b.filled[i]:
                    # As DDP: a gradient accumulated earlier (in no_sync())
                    # counts, an absent one is zero.
                    if p.grad is None:
                        view.zero_()
                    else:
                        view.copy_(p.grad)
                    b.filled[i] = True
        self._launch_ready()
        try:
            for b, fut in zip(self.buckets, self._futures):
                result = fut.wait()
                flat = result[0] if isinstance(result, list) else result
                off = 0
                for p in b.parameters():
                    avg = flat[off:off + p.numel()].view_as(p)
                    if p.grad is None:
                        p.grad = avg.clone()
                    else:
                        p.grad.copy_(avg)
                    off += p.numel()
        finally:
            self._reset()

    def _reset(self) -> None:
        for b in self.buckets:
            b.filled = [False] * len(b.parameters())
        self._futures = [None] * len(self.buckets)
        self._next = 0

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Like ``DistributedDataParallel.no_sync()``: backward passes in the
        block accumulate gradients in ``p.grad`` without communicating; the
        first backward after the block (then :meth:`wait`) averages the
        accumulated gradients over the group. Every rank must run the same
        number of synchronised backward passes. Unlike DDP, which decides
        at forward, what counts is where ``backward()`` runs."""
        if any(any(b.filled) for b in self.buckets):
            raise RuntimeError("GradientBucketer.no_sync(): a backward since the last wait() already "
                               "started communicating; call wait() first")
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def remove(self) -> None:
        """Unregisters the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> GradientBucketer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.wait()
        else:
            self._reset()

    def __repr__(self) -> str:
        how = "given"
        if self.alpha_s is not None:
            how = f"measured: alpha {self.alpha_s * 1e6:.0f} us, {1e-9 / self.beta_s_per_byte:.2f} GB/s"
        sizes = ", ".join(f"{b.buffer().numel() * b.buffer().element_size() / 2**20:.2f}" for b in self.buckets)
        return (f"GradientBucketer({len(self.params)} params, {len(self.buckets)} buckets [{sizes}] MiB, "
                f"bucket_cap {self.bucket_cap_bytes / 2**20:.2f} MiB ({how}), "
                f"hook={getattr(self._hook, '__name__', self._hook)})")
