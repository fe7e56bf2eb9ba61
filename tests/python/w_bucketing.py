"""Rank-side bodies for rustccl.bucketing.GradientBucketer: gradients equal
DDP's and a locally computed average, buckets start during backward,
parameters unused on some ranks, comm hooks, the measured bucket size."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rustccl.hooks as H
from refs import Checker
from rustccl.bucketing import MAX_BUCKET_BYTES, MIN_BUCKET_BYTES, GradientBucketer

D = 48


class TwoHeads(nn.Module):
    """A trunk and two heads; `use_b=False` leaves head b without gradients."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D), nn.ReLU())
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, 4)

    def forward(self, x, use_b=True):
        h = self.trunk(x)
        out = self.a(h).pow(2).mean()
        return out + self.b(h).pow(2).mean() if use_b else out


def data(rank, step):
    return torch.randn(16, D, generator=torch.Generator().manual_seed(1000 * rank + step))


def local_average(model, world, step, use_b=lambda r: True):
    """Every rank's gradients computed here (none: zeros), averaged."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for r in range(world):
        m = copy.deepcopy(model)
        m.zero_grad(set_to_none=True)
        m(data(r, step), use_b(r)).backward()
        for acc, p in zip(total, m.parameters()):
            if p.grad is not None:
                acc += p.grad / world
    return total


def close(c, what, got, want, tol=1e-6):
    d = max((g - w).abs().max().item() for g, w in zip(got, want))
    c.true(f"{what} (max diff {d:.3g})", d <= tol)


def vs_ddp(rank: int, world: int, steps: int) -> tuple[int, list[str]]:
    torch.set_num_threads(1)
    c = Checker(rank)
    m_b, m_d = TwoHeads(), TwoHeads()
    bucketer = GradientBucketer(m_b, bucket_cap_mb=0.005)
    ddp = DDP(m_d, bucket_cap_mb=0.005)
    c.true(f"several buckets: {bucketer}", len(bucketer.buckets) >= 3)
    o_b, o_d = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (m_b, m_d))
    for step in range(steps):
        want = local_average(m_b, world, step)
        for o in (o_b, o_d):
            o.zero_grad()
        if step % 2:
            with bucketer:  # the context-manager form
                m_b(data(rank, step)).backward()
        else:
            m_b(data(rank, step)).backward()
            bucketer.wait()
        ddp(data(rank, step)).backward()
        close(c, f"step {step}: bucketer = DDP", [p.grad for p in m_b.parameters()], [p.grad for p in m_d.parameters()])
        close(c, f"step {step}: bucketer = local average", [p.grad for p in m_b.parameters()], want)
        o_b.step()
        o_d.step()

    # Buckets start while backward is still running: the first bucket (last
    # layers) is launched before the first layer's gradient exists.
    events = []

    def recording(state, bucket):
        events.append(f"launch {bucket.index()}")
        return H.allreduce_hook(state, bucket)

    model = TwoHeads()
    rec = GradientBucketer(model, bucket_cap_mb=0.005, hook=recording)
    model.trunk[0].weight.register_post_accumulate_grad_hook(lambda p: events.append("first layer grad"))
    model(data(rank, 0)).backward()
    events.append("backward done")
    rec.wait()
    c.true(f"bucket 0 starts before backward reaches the first layer: {events}",
           events.index("launch 0") < events.index("first layer grad"))
    c.true(f"every bucket started during backward: {events}",
           events.index(f"launch {len(rec.buckets) - 1}") < events.index("backward done"))
    return c.count, c.failures


def features(rank: int, world: int) -> tuple[int, list[str]]:
    torch.set_num_threads(1)
    c = Checker(rank)
    # Head b is used on rank 0 only (after a step where all used it): on
    # the other ranks its bucket never fills, and wait() sends zeros for it,
    # in bucket order on every rank.
    model = TwoHeads()
    bucketer = GradientBucketer(model, bucket_cap_mb=0.005)
    model(data(rank, 0)).backward()
    bucketer.wait()
    model.zero_grad()
    used = lambda r: r == 0  # noqa: E731
    want = local_average(model, world, 1, used)
    model(data(rank, 1), used(rank)).backward()
    bucketer.wait()
    close(c, "head used on one rank: averaged with zeros", [p.grad for p in model.parameters()], want)

    # Comm hooks on the bucketer's buckets: a (state, hook) pair and a bare hook.
    for what, hook, tol in (("top-k ratio 1 (state, hook)", (H.TopKState(ratio=1.0), H.topk_hook), 1e-6),
                            ("fp16 hook", H.fp16_compress_hook, 2e-3),
                            ("PowerSGD rank 2", (H.PowerSGDState(start_iter=0, matrix_approximation_rank=2),
                                                 H.powersgd_hook), None)):
        model = TwoHeads()
        b = GradientBucketer(model, bucket_cap_mb=0.005, hook=hook)
        want = local_average(model, world, 1)
        model(data(rank, 1)).backward()
        b.wait()
        got = [p.grad for p in model.parameters()]
        if tol is not None:
            close(c, what, got, want, tol)
        else:  # lossy: same on all ranks, rank <= 2 per matrix, close in norm
            flat = torch.cat([g.flatten() for g in got])
            every = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(every, flat)
            c.true(f"{what}: identical on every rank", all(torch.equal(e, flat) for e in every))
            c.true(f"{what}: rank 2", torch.linalg.matrix_rank(got[0]).item() <= 2)
            rel = (flat - torch.cat([w.flatten() for w in want])).norm() / flat.norm()
            c.true(f"{what}: relative error {rel:.3f} < 1", rel < 1)
        b.remove()

    # A second backward before wait() is refused; wait() still completes the step.
    model = TwoHeads()
    b = GradientBucketer(model, bucket_cap_mb=0.005)
    model(data(rank, 2)).backward()
    try:
        model(data(rank, 2)).backward()
        c.true("second backward before wait() raises", False)
    except RuntimeError as e:
        c.true(f"second backward before wait(): {e}", "twice before wait()" in str(e))
    b.wait()

    # Gradient accumulation: two backward passes in no_sync(), then one
    # synchronised; equals DDP's no_sync() and the local average of the
    # summed gradients.
    m_b, m_d = TwoHeads(), TwoHeads()
    want = [sum(g) for g in zip(*(local_average(m_b, world, step) for step in (10, 11, 12)))]
    b = GradientBucketer(m_b, bucket_cap_mb=0.005)
    ddp = DDP(m_d, bucket_cap_mb=0.005)
    with b.no_sync(), ddp.no_sync():
        for step in (10, 11):
            m_b(data(rank, step)).backward()
            ddp(data(rank, step)).backward()
        b.wait()  # nothing to wait for inside no_sync()
    close(c, "no_sync: gradients stay local", [p.grad for p in m_b.parameters()], [p.grad for p in m_d.parameters()])
    m_b(data(rank, 12)).backward()
    try:
        with b.no_sync():
            pass
        c.true("no_sync() after a synchronised backward raises", False)
    except RuntimeError as e:
        c.true(f"no_sync() after a synchronised backward: {e}", "call wait() first" in str(e))
    b.wait()
    ddp(data(rank, 12)).backward()
    close(c, "accumulated: bucketer = DDP no_sync", [p.grad for p in m_b.parameters()], [p.grad for p in m_d.parameters()])
    close(c, "accumulated: bucketer = local average", [p.grad for p in m_b.parameters()], want)
    b.remove()
    # Head b gets gradients only in the accumulating passes: what it
    # accumulated is averaged, not replaced by zeros.
    model = TwoHeads()
    no_b = lambda r: False  # noqa: E731
    want = [sum(g) for g in zip(local_average(model, world, 20), local_average(model, world, 21, no_b))]
    b = GradientBucketer(model, bucket_cap_mb=0.005)
    with b.no_sync():
        model(data(rank, 20)).backward()
    model(data(rank, 21), use_b=False).backward()
    b.wait()
    close(c, "accumulated, unused in the last pass", [p.grad for p in model.parameters()], want)
    b.remove()

    # Measured bucket size: the same on every rank, within the clamps.
    b = GradientBucketer(TwoHeads())
    sizes = [None] * world
    dist.all_gather_object(sizes, (b.bucket_cap_bytes, b.alpha_s, b.beta_s_per_byte))
    c.true(f"measured bucket size agreed by all ranks: {sizes}", all(s == sizes[0] for s in sizes))
    c.true(f"measured bucket size within clamps: {b}", MIN_BUCKET_BYTES <= b.bucket_cap_bytes <= MAX_BUCKET_BYTES)
    c.true(f"fit is sane: alpha {b.alpha_s}, beta {b.beta_s_per_byte}", b.alpha_s >= 0 and b.beta_s_per_byte > 0)
    c.true(f"repr reports it: {b!r}", "measured: alpha" in repr(b) and "GB/s" in repr(b))
    return c.count, c.failures
