"""The NVLink kernels (one-shot and two-shot all-reduce, all-gather,
reduce-scatter) compile with the NVRTC that torch's CUDA
wheels ship (no GPU needed); the GPU tests in test_cuda.py run them."""

import re

import pytest
import torch

import rustccl

pytestmark = pytest.mark.skipif(torch.version.cuda is None, reason="a CPU-only torch build ships no NVRTC")


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_one_shot_kernels_compile(cc):
    ptx = rustccl._rustccl._one_shot_ptx(*cc)
    entries = set(re.findall(r"\.entry (rustccl_\w+)\(", ptx))
    want = {f"rustccl_{k}_{d}_{o}" for k in ("one_shot", "two_shot", "reduce_scatter")
            for d in ("f32", "f64", "f16", "bf16", "i32", "i64")
            for o in ("sum", "avg", "prod", "min", "max")} | {"rustccl_ag"}
    assert entries == want
    assert f".target sm_{cc[0]}{cc[1]}" in ptx
    # the flags use system-scope acquire / release, and no local memory spills
    assert "ld.acquire.sys" in ptx and "st.release.sys" in ptx
    assert ".local" not in ptx


def test_compile_errors_are_reported():
    with pytest.raises(RuntimeError, match="rustccl: NVRTC"):
        rustccl._rustccl._one_shot_ptx(1, 0)  # no such architecture
