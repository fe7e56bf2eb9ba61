"""``python -m rustccl.bench``: nccl-tests-style benchmark of rustccl against
the stock torch backend (gloo on CPU, nccl on CUDA) in the same run.

    python -m rustccl.bench                           # 2 ranks on this host, CPU, rustccl vs gloo
    python -m rustccl.bench --world 4 --check --ddp   # verify results, add the toy DDP step
    torchrun --nproc_per_node=8 -m rustccl.bench --device cuda   # rustccl vs nccl

Methodology (the same as ``shared/anchors/anchor_bench.py``, so rows compare
with the committed anchors):

* sizes ``--min-bytes`` .. ``--max-bytes`` times ``--factor`` (per-rank
  buffer; defaults 8 B .. 32 MiB on CPU, .. 1 GiB on CUDA, factor 4);
* per point: ``--warmup`` untimed calls, sync + barrier, ``--iters`` calls
  back to back, one device sync, host time / iters = ``us`` (rank 0);
* algbw = bytes / time, busbw = algbw x factor (2(n-1)/n all_reduce,
  (n-1)/n all_gather / reduce_scatter / all_to_all, 1 broadcast and
  send_recv); float32 by default. Details: :mod:`.metrics`;
* each (op, backend) runs in its own freshly created process group, one
  backend alive at a time, backend order alternating op by op: :mod:`.sweep`;
* output: progress bar, markdown table (stdout and ``.md``), JSON lines
  (``.jsonl``) and a PNG (busbw and latency vs size) in ``--out``:
  :mod:`.report`, :mod:`.plot`.

Modules: ``__main__`` (options, torchrun vs self-spawn), ``runner`` (one
rank), ``sweep`` (blocks and timing), ``ops`` (buffers, calls, ``--check``),
``metrics`` (pure bandwidth math), ``report``, ``plot``, ``progress``.
"""

from .metrics import OPS, bandwidths, busbw_factor

__all__ = ["OPS", "bandwidths", "busbw_factor", "main"]


def main(argv=None) -> int:
    """Entry point of ``python -m rustccl.bench`` (returns the exit status)."""
    from .__main__ import main as _main

    return _main(argv)
