"""Gradient communication hooks for ``DistributedDataParallel``.

    import rustccl.hooks as H
    ddp.register_comm_hook(None, H.fp16_compress_hook)                 # default group
    ddp.register_comm_hook(H.TopKState(ratio=0.01), H.topk_hook)

Each hook takes ``(state, bucket)``, returns a future of the bucket's averaged
(flat) gradient, and divides by the world size itself. They work on CPU and
CUDA tensors, over any process group and backend, and issue their
collectives from the hook call so every rank issues them in the same order.

| hook | state | sends (float32 bucket of n entries) |
|---|---|---|
| allreduce_hook | process group / None / CommState | 4n bytes: the exact average |
| fp16_compress_hook, bf16_compress_hook | same | 2n bytes |
| powersgd_hook | PowerSGDState | r(rows + cols) per matrix, vectors as is |
| topk_hook | TopKState | 8k bytes, k = ratio x n, (value, index) pairs |
| int8_hook | QuantState | n bytes + 4 per chunk (2048 entries of one parameter) |
| engine_compression(codec) | process group / None / CommState | 4n bytes into rustccl's all-reduce; its host leaders send each other 2n (bf16, fp16) or n + 4n/256 (int8) |

The states keep per-bucket memory (error feedback, warm start) that is
safe across DDP's bucket rebuild, count ``bytes_sent`` against
``bytes_uncompressed``, and checkpoint with ``state_dict()`` /
``load_state_dict()``.
"""

from ._state import CommState
from .default import allreduce_hook, bf16_compress_hook, fp16_compress_hook
from .engine import engine_compression
from .powersgd import PowerSGDState, powersgd_hook
from .quant import QuantState, int8_hook
from .topk import TopKState, topk_hook

__all__ = [
    "CommState",
    "PowerSGDState",
    "QuantState",
    "TopKState",
    "allreduce_hook",
    "bf16_compress_hook",
    "engine_compression",
    "fp16_compress_hook",
    "int8_hook",
    "powersgd_hook",
    "topk_hook",
]
