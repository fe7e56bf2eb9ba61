"""Test inputs and reference results computed locally with torch, the same
on every rank (each rank can rebuild any other rank's input)."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

R = dist.ReduceOp

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool,
]
OPS = {
    "SUM": R.SUM, "AVG": R.AVG, "PRODUCT": R.PRODUCT, "MIN": R.MIN,
    "MAX": R.MAX, "BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR,
}


def supported(dtype: torch.dtype, opname: str) -> bool:
    if opname in ("BAND", "BOR", "BXOR"):
        return not dtype.is_floating_point
    if opname == "AVG":
        return dtype != torch.bool
    return True


def values(dtype: torch.dtype, opname: str, rank: int, n: int, salt: int = 0) -> torch.Tensor:
    """Small integers: every partial sum / product is exact in every dtype."""
    i = torch.arange(n)
    if dtype == torch.bool:
        return ((rank * 3 + i + salt) % 4) != 0
    if opname == "PRODUCT":
        v = (rank + 2 * i + salt) % 3 + 1
    elif dtype == torch.uint8:
        v = (rank * 7 + i * 3 + salt) % 13
    else:
        v = (rank * 7 + i * 3 + salt) % 11 - 5
    return v.to(dtype)


def reference(dtype: torch.dtype, opname: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    n = len(inputs)
    if dtype == torch.bool:
        s = torch.stack(inputs)
        if opname in ("SUM", "MAX", "BOR"):
            return s.any(0)
        if opname in ("PRODUCT", "MIN", "BAND"):
            return s.all(0)
        if opname == "BXOR":
            return (s.sum(0) % 2).bool()
        raise ValueError(opname)
    if dtype.is_floating_point:
        s = torch.stack([t.double() for t in inputs])
        out = {
            "SUM": lambda: s.sum(0), "AVG": lambda: s.sum(0) / n, "PRODUCT": lambda: s.prod(0),
            "MIN": lambda: s.amin(0), "MAX": lambda: s.amax(0),
        }[opname]()
        return out.to(dtype)
    s = torch.stack([t.long() for t in inputs])
    if opname == "SUM":
        return s.sum(0).to(dtype)
    if opname == "AVG":
        wrapped = s.sum(0).to(dtype).long()
        return torch.div(wrapped, n, rounding_mode="trunc").to(dtype)
    if opname == "PRODUCT":
        return s.prod(0).to(dtype)
    if opname == "MIN":
        return s.amin(0).to(dtype)
    if opname == "MAX":
        return s.amax(0).to(dtype)
    fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[opname]
    return functools.reduce(fn, [t.to(dtype) for t in inputs])


class Checker:
    """Collects mismatches instead of stopping at the first one."""

    def __init__(self, rank: int):
        self.rank = rank
        self.failures: list[str] = []
        self.count = 0

    def eq(self, what: str, got: torch.Tensor, want: torch.Tensor, opname: str = "SUM") -> None:
        self.count += 1
        if got.dtype != want.dtype or got.shape != want.shape:
            self.failures.append(f"rank {self.rank} {what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
            return
        if opname == "AVG" and got.dtype.is_floating_point:
            tol = 2e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-6
            ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
        else:
            ok = torch.equal(got, want)
        if not ok:
            bad = (got != want).nonzero()
            idx = bad[0].tolist() if len(bad) else "?"
            self.failures.append(
                f"rank {self.rank} {what}: mismatch at {idx}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}"
            )

    def true(self, what: str, cond: bool) -> None:
        self.count += 1
        if not cond:
            self.failures.append(f"rank {self.rank} {what}")
