"""Rank-side bodies for rustccl.hooks: each hook on hand-built buckets
against references computed locally from every rank's inputs (each rank
can regenerate any rank's gradients), checkpoints and bucket-rebuild safety
of the states, and DDP training with each hook."""

from __future__ import annotations

import io
import math

import torch
import torch.distributed as dist

import rustccl.hooks as H
from refs import Checker

# matrices PowerSGD compresses, a vector and a matrix too small to compress, a 3-d tensor
SHAPES = [(24, 40), (40,), (3, 2), (6, 5, 4)]
N = sum(math.prod(s) for s in SHAPES)


class FakeBucket:
    """What DDP hands a hook (dist.GradBucket's interface) over given tensors."""

    def __init__(self, tensors, params, index=0, last=True):
        self._buf = torch.cat([t.reshape(-1) for t in tensors])
        self._views, off = [], 0
        for t in tensors:
            self._views.append(self._buf[off:off + t.numel()].view_as(t))
            off += t.numel()
        self._params, self._index, self._last = params, index, last

    def buffer(self):
        return self._buf

    def gradients(self):
        return self._views

    def parameters(self):
        return self._params

    def index(self):
        return self._index

    def is_last(self):
        return self._last


def params_for(shapes):
    return [torch.nn.Parameter(torch.zeros(s)) for s in shapes]


def grads(rank, step, shapes=SHAPES, low_rank=0):
    """Rank `rank`'s gradients at `step`. With low_rank=r every matrix of
    every rank lies in one shared r-dimensional column space, so the
    average has rank <= r and PowerSGD of rank r must reproduce it."""
    g = torch.Generator().manual_seed(7919 * rank + step)
    out = []
    for i, s in enumerate(shapes):
        if low_rank and len(s) > 1 and min(s[0], math.prod(s[1:])) > low_rank:
            u = torch.randn(s[0], low_rank, generator=torch.Generator().manual_seed(100 + i))
            out.append((u @ torch.randn(low_rank, math.prod(s[1:]), generator=g)).view(s))
        else:
            out.append(torch.randn(s, generator=g))
    return out


def flat(ts):
    return torch.cat([t.reshape(-1) for t in ts])


def mean(world, step, **kw):
    return torch.stack([flat(grads(r, step, **kw)) for r in range(world)]).mean(0)


def run_hook(hook, state, rank, step, params, **kw):
    return hook(state, FakeBucket(grads(rank, step, **kw), params)).wait()


def topk_sent(x, ratio):
    """x with all but its ceil(ratio n) largest-magnitude entries zeroed."""
    top = x.abs().argsort(descending=True)[:math.ceil(ratio * x.numel())]
    sent = torch.zeros_like(x)
    sent[top] = x[top]
    return sent


def close(c, what, got, want, rtol, atol):
    d = (got.double() - want.double()).abs().max().item()
    c.true(f"{what} (max |diff| {d:.3g})", torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol))


def ef_invariant(c, what, state, params, world, outs, steps):
    """With error feedback, sum_t result_t = sum_t mean_t - mean_r(remainder_r):
    nothing is lost, only delayed (e_r,t = c_r,t - sent, c = g + e_prev)."""
    err = state.flat_memory(FakeBucket(grads(0, 0), params), "error")
    dist.all_reduce(err)
    want = sum(mean(world, s) for s in steps) - err / world
    close(c, f"{what}: error feedback loses nothing", sum(outs), want, 1e-5, 1e-5)


def _exact_lossless(c, rank, world, P):
    sub = dist.new_group(list(range(world)))
    acct = H.CommState(sub)
    for label, state in (("None", None), ("group", sub), ("CommState", acct)):
        for step in range(2):
            close(c, f"allreduce_hook({label}) step {step}", run_hook(H.allreduce_hook, state, rank, step, P),
                  mean(world, step), 1e-6, 1e-6)
    c.true(f"CommState counts 4n bytes/step: {acct}", acct.bytes_sent == 2 * N * 4 and acct.iter == 2
           and acct.last_step_bytes_sent == N * 4 and acct.compression_ratio == 1.0)
    for hook, tol in ((H.fp16_compress_hook, 2e-3), (H.bf16_compress_hook, 1.6e-2)):
        half = H.CommState()
        close(c, hook.__name__, run_hook(hook, half, rank, 0, P), mean(world, 0), tol, tol)
        c.true(f"{hook.__name__} sends 2n bytes: {half}", half.bytes_sent == N * 2 and half.compression_ratio == 2.0)
    # 80000 on rank 0 is beyond fp16 (max 65504) but its share of the average is not
    v = [80000.0] + [-20000.0] * (world - 1)
    b = FakeBucket([torch.full((8,), v[rank])], params_for([(8,)]))
    close(c, "fp16 divides before casting", H.fp16_compress_hook(None, b).wait(), torch.full((8,), sum(v) / world),
          1e-3, 0)


def _exact_topk(c, rank, world, P):
    full = H.TopKState(ratio=1.0)
    close(c, "top-k ratio 1 is the exact average", run_hook(H.topk_hook, full, rank, 0, P), mean(world, 0), 1e-6, 1e-6)
    for ef in (True, False):
        state, k = H.TopKState(ratio=0.1, use_error_feedback=ef), math.ceil(0.1 * N)
        rem = [torch.zeros(N) for _ in range(world)]
        outs = []
        for step in range(3):
            want = torch.zeros(N)
            for r in range(world):  # reference: every rank's top-k, computed here
                comp = flat(grads(r, step)) + rem[r]
                sent = topk_sent(comp, 0.1)
                want += sent
                rem[r] = comp - sent if ef else rem[r]
            outs.append(run_hook(H.topk_hook, state, rank, step, P))
            close(c, f"top-k 10% ef={ef} step {step}", outs[-1], want / world, 1e-6, 1e-6)
        c.true(f"top-k sends k (value, int32 index) pairs: {state}", state.bytes_sent == 3 * k * 8)
        if ef:
            ef_invariant(c, "top-k", state, P, world, outs, range(3))


def entry_scales(ts, chunk):
    """Per entry, the int8 scale of its chunk: max|x| / 127 over `chunk`
    consecutive entries of one tensor."""
    return torch.cat([torch.nn.functional.pad(t.reshape(-1), (0, -t.numel() % chunk)).view(-1, chunk)
                      .abs().amax(1).div(127).repeat_interleave(chunk)[:t.numel()] for t in ts])


def _exact_int8(c, rank, world, P):
    for ef in (True, False):
        state = H.QuantState(use_error_feedback=ef)
        state.chunk_size = 64  # several chunks per parameter, the last one partial
        outs = [run_hook(H.int8_hook, state, rank, s, P) for s in range(3)]
        bound = sum(entry_scales(grads(r, 0), 64) for r in range(world)) / (2 * world) + 1e-6
        chunks = sum(math.ceil(math.prod(sh) / 64) for sh in SHAPES)
        err0 = (outs[0] - mean(world, 0)).abs()
        c.true(f"int8 ef={ef} step 0 within half a quantisation step (worst {(err0 / bound).max():.3f} of bound)",
               bool((err0 <= bound).all()))
        c.true(f"int8 sends n + 4 per chunk: {state}", state.bytes_sent == 3 * (N + 4 * chunks))
        if ef:
            ef_invariant(c, "int8", state, P, world, outs, range(3))
        else:
            c.true("int8 without error feedback keeps no memory", not any(state.state_dict()["memory"].values()))


def _spectrum_grads(shape, s=(3.0, 2.0, 1.0, 0.5)):
    """The same matrix on every rank, singular values `s`: power iteration
    converges at rate (s2/s1)^2 per step."""
    g = torch.Generator().manual_seed(5)
    u = torch.linalg.qr(torch.randn(shape[0], len(s), generator=g)).Q
    v = torch.linalg.qr(torch.randn(shape[1], len(s), generator=g)).Q
    return u @ torch.diag(torch.tensor(s)) @ v.t()


def _exact_powersgd(c, rank, world, P):
    state = H.PowerSGDState(matrix_approximation_rank=1, start_iter=2)
    for step in range(2):
        close(c, f"PowerSGD plain all-reduce before start_iter, step {step}",
              run_hook(H.powersgd_hook, state, rank, step, P), mean(world, step), 1e-6, 1e-6)
    c.true(f"plain steps send 4n bytes: {state}", state.bytes_sent == 2 * N * 4 and state.iter == 2)
    for step in (2, 3):  # rank-1 average: reproduced exactly, with error feedback carried along
        close(c, f"PowerSGD rank 1 on rank-1 gradients, step {step}",
              run_hook(H.powersgd_hook, state, rank, step, P, low_rank=1), mean(world, step, low_rank=1), 1e-4, 1e-5)
    dense, p_q = 40 + 6, (24 + 40) + (6 + 20)
    c.true(f"PowerSGD sends vectors + r(n+m) per matrix: {state.last_step_bytes_sent}",
           state.last_step_bytes_sent == (dense + p_q) * 4)
    r2 = H.PowerSGDState(matrix_approximation_rank=2, start_iter=0)
    close(c, "PowerSGD rank 2 on rank-2 gradients", run_hook(H.powersgd_hook, r2, rank, 0, P, low_rank=2),
          mean(world, 0, low_rank=2), 1e-4, 1e-5)
    never = H.PowerSGDState(start_iter=0, min_compression_rate=1e9)
    close(c, "PowerSGD sends incompressible buckets as is", run_hook(H.powersgd_hook, never, rank, 0, P),
          mean(world, 0), 1e-6, 1e-6)
    # full-rank gradients: rank-1 results per matrix, exact vectors, nothing lost
    ef = H.PowerSGDState(start_iter=0)
    outs = [run_hook(H.powersgd_hook, ef, rank, s, P) for s in range(3)]
    m0 = outs[0][:960].view(24, 40)
    c.true("PowerSGD result has rank 1", torch.linalg.matrix_rank(m0, rtol=1e-4).item() == 1)
    close(c, "PowerSGD vector sent exactly", outs[0][960:1000], mean(world, 0)[960:1000], 1e-5, 1e-5)
    ef_invariant(c, "PowerSGD", ef, P, world, outs, range(3))
    # warm start: power iteration across steps reaches the best rank-1 approximation
    m = _spectrum_grads((24, 40))
    u, s, vh = torch.linalg.svd(m)
    best = s[0] * torch.outer(u[:, 0], vh[0])
    for warm in (True, False):
        st, pm = H.PowerSGDState(start_iter=0, use_error_feedback=False, warm_start=warm), params_for([(24, 40)])
        for _ in range(20):
            out = H.powersgd_hook(st, FakeBucket([m.clone()], pm)).wait()
        rel = ((out.view(24, 40) - best).norm() / best.norm()).item()
        c.true(f"PowerSGD warm_start={warm}: distance to best rank-1 approximation {rel:.2e}",
               rel < 1e-3 if warm else rel > 1e-2)


def _checkpoints(c, rank, world, P):
    def quant():
        s = H.QuantState()
        s.chunk_size = 64
        return s
    cases = [
        ("top-k", lambda: H.TopKState(ratio=0.1), H.topk_hook),
        ("int8", quant, H.int8_hook),
        ("PowerSGD", lambda: H.PowerSGDState(start_iter=1, matrix_approximation_rank=2), H.powersgd_hook),
        ("PowerSGD cold", lambda: H.PowerSGDState(start_iter=1, warm_start=False), H.powersgd_hook),
    ]
    for label, make, hook in cases:
        a = make()
        for step in range(3):
            run_hook(hook, a, rank, step, P)
        blob = io.BytesIO()
        torch.save(a.state_dict(), blob)
        blob.seek(0)
        b = make()
        b.load_state_dict(torch.load(blob, weights_only=True))
        # a restarted process has new parameter objects of the same shapes
        ra, rb = run_hook(hook, a, rank, 3, P), run_hook(hook, b, rank, 3, params_for(SHAPES))
        rf = run_hook(hook, make(), rank, 3, P)
        c.true(f"{label}: restored state gives the identical next step", torch.equal(ra, rb))
        c.true(f"{label}: ... which a fresh state does not", not torch.equal(ra, rf))
        c.true(f"{label}: counters restored", (a.iter, a.bytes_sent) == (b.iter, b.bytes_sent))


def _rebuild(c, rank, world, P):
    """DDP regroups parameters into other buckets after its first iteration:
    each parameter's remainder must follow it into its new bucket."""
    s = H.TopKState(ratio=0.1)
    run_hook(H.topk_hook, s, rank, 0, P)
    numels = [math.prod(sh) for sh in SHAPES]
    rem = [(flat(grads(r, 0)) - topk_sent(flat(grads(r, 0)), 0.1)).split(numels) for r in range(world)]
    g1 = [grads(r, 1) for r in range(world)]
    for index, members in enumerate([[3, 1], [2, 0]]):
        b = FakeBucket([g1[rank][i] for i in members], [P[i] for i in members], index=index, last=index == 1)
        want = sum(topk_sent(torch.cat([g1[r][i].reshape(-1) + rem[r][i] for i in members]), 0.1)
                   for r in range(world)) / world
        close(c, f"regrouped bucket {members}: remainders followed their parameters", H.topk_hook(s, b).wait(),
              want, 1e-6, 1e-6)
    fresh = params_for(SHAPES)  # other parameters of the same shapes: no memory
    close(c, "new parameters start without memory", run_hook(H.topk_hook, s, rank, 2, fresh),
          sum(topk_sent(flat(grads(r, 2)), 0.1) for r in range(world)) / world, 1e-6, 1e-6)


def exact(rank: int, world: int) -> tuple[int, list[str]]:
    c = Checker(rank)
    P = params_for(SHAPES)
    _exact_lossless(c, rank, world, P)
    _exact_topk(c, rank, world, P)
    _exact_int8(c, rank, world, P)
    _exact_powersgd(c, rank, world, P)
    _checkpoints(c, rank, world, P)
    _rebuild(c, rank, world, P)
    return c.count, c.failures
