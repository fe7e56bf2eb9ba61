"""PowerSGD: rank-r gradient compression with error feedback and warm start.

Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019). Every gradient matrix M (a
parameter's gradient viewed as ``shape[0] x rest``) is approximated by
``P @ Q.T`` with P (n x r), Q (m x r), found by one step of power iteration
shared by all ranks::

    P = sum_ranks M_i @ Q        (all-reduce 1)
    P = orthonormalize(P)
    Q = sum_ranks M_i.T @ P      (all-reduce 2)
    M_avg ~= P @ Q.T / world

so a rank sends r(n + m) numbers instead of nm. Error feedback adds what
the approximation missed last step to this step's gradient; warm start
reuses last step's Q, so the power iteration keeps improving across steps.
Vectors (biases) and matrices too small to compress well are averaged
uncompressed, inside all-reduce 1.
"""

from typing import Any, Optional

import torch
import torch.distributed as dist

from ._state import CommState
from .default import allreduce_hook


class PowerSGDState(CommState):
    """Configuration and memory of :func:`powersgd_hook`.

    - ``matrix_approximation_rank``: r; larger is more accurate, sends more.
    - ``start_iter``: steps of plain all-reduce before compression starts
      (early training is sensitive to gradient error).
    - ``min_compression_rate``: a matrix is compressed only if
      ``nm / (r (n + m))`` is at least this; otherwise sent as is.
    - ``use_error_feedback``, ``warm_start``: see the module docstring.
    - ``seed``: for the random initial Q, identical on every rank.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, matrix_approximation_rank: int = 1,
                 start_iter: int = 1000, min_compression_rate: float = 2.0, use_error_feedback: bool = True,
                 warm_start: bool = True, seed: int = 0):
        super().__init__(process_group)
        if matrix_approximation_rank < 1:
            raise ValueError(f"matrix_approximation_rank must be >= 1, got {matrix_approximation_rank}")
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_iter = start_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.seed = seed
        # CPU generator: the same sequence on every rank and every device.
        self._rng = torch.Generator().manual_seed(seed)

    def _extra_state(self) -> dict[str, Any]:
        return {"rng": self._rng.get_state()}

    def _load_extra_state(self, sd: dict[str, Any]) -> None:
        self._rng.set_state(sd["rng"])

    def _plan(self, bucket: dist.GradBucket) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, int, dict]]]:
        """Splits a bucket's gradients into (sent as is, [(matrix view,
        rank, the parameter's memory)])."""
        dense, low_rank = [], []
        for g, mem in zip(bucket.gradients(), self.memory(bucket)):
            if g.dim() > 1:
                m = g.view(g.shape[0], -1)
                r = min(self.matrix_approximation_rank, *m.shape)
                if m.numel() >= self.min_compression_rate * r * sum(m.shape):
                    low_rank.append((m, r, mem))
                    continue
            dense.append(g)
        return dense, low_rank


def _orthonormalize_(p: torch.Tensor) -> None:
    """Orthonormal columns spanning p's, in place (QR in float32: half
    precision QR is not supported and would lose too much)."""
    p.copy_(torch.linalg.qr(p.float(), mode="reduced").Q)


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket with PowerSGD (see the module docstring); plain
    all-reduce for the first ``state.start_iter`` steps.

    Ordering: all-reduce 2 needs the result of all-reduce 1. Issuing it from
    a ``.then`` callback of the first would run it on the backend's
    completion thread, racing the next bucket's all-reduce 1 issued by the
    autograd thread: ranks could submit them in different orders and
    mismatch. Instead the hook waits for all-reduce 1 itself and issues
    all-reduce 2 before returning, so every rank issues bucket b's two
    all-reduces, then bucket b+1's, in the same order. The cost is that
    backward pauses for one small all-reduce (the P factors) per bucket.
    """
    if state.iter < state.start_iter:
        return allreduce_hook(state, bucket)
    dense, low_rank = state._plan(bucket)
    if not low_rank:  # nothing worth compressing in this bucket
        return allreduce_hook(state, bucket)
    group, world = state.group(), state.world_size()
    buf = bucket.buffer()
    if state.use_error_feedback:
        state.add_error(bucket, buf)
        compensated = buf.clone()

    # Q factors: last step's (warm start) or random, drawn in bucket order
    # from the state's generator, hence the same on every rank.
    qs = []
    for m, r, mem in low_rank:
        q = mem.get("q") if state.warm_start else None
        if q is None or q.shape != (m.shape[1], r):
            q = torch.randn(m.shape[1], r, generator=state._rng).to(buf.device, buf.dtype)
        qs.append(q)
    q_flat = torch.cat([q.reshape(-1) for q in qs])
    qs = [v.view_as(q) for v, q in zip(q_flat.split([q.numel() for q in qs]), qs)]
    # [dense gradients | P factors], reduced by one all-reduce
    p_shapes = [(m.shape[0], r) for m, r, _ in low_rank]
    n_dense = sum(g.numel() for g in dense)
    first = torch.empty(n_dense + sum(n * r for n, r in p_shapes), dtype=buf.dtype, device=buf.device)
    dense_part, *p_parts = first.split([n_dense] + [n * r for n, r in p_shapes])
    ps = [v.view(shape) for v, shape in zip(p_parts, p_shapes)]
    if dense:
        torch.cat([g.reshape(-1) for g in dense], out=dense_part)
    for (m, _, _), p, q in zip(low_rank, ps, qs):
        _orthonormalize_(q)  # keeps a warm-started Q well scaled
        torch.matmul(m, q, out=p)

    dist.all_reduce(first, group=group)  # waits: see the docstring
    for g, v in zip(dense, dense_part.split([g.numel() for g in dense])):
        g.copy_(v.view_as(g)).div_(world)
    for (m, _, _), p, q in zip(low_rank, ps, qs):
        _orthonormalize_(p)
        torch.matmul(m.t(), p, out=q)
    fut = dist.all_reduce(q_flat, group=group, async_op=True).get_future()
    state.account(bucket, (first.numel() + q_flat.numel()) * buf.element_size())

    def decompress(f: torch.futures.Future) -> torch.Tensor:
        f.wait()
        for (m, _, mem), p, q in zip(low_rank, ps, qs):
            torch.matmul(p, q.t(), out=m)
            m.div_(world)
            if state.warm_start:
                mem["q"] = q
        if state.use_error_feedback:
            state.set_flat_memory(bucket, "error", compensated.sub_(buf))
        return buf

    return fut.then(decompress)

