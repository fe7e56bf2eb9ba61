"""State shared by rustccl's comm hooks.

A DDP comm hook is called once per gradient bucket per step, with ``(state,
bucket)``. Compression hooks need memory that outlives a call (the error
feedback remainder, PowerSGD's warm-start factors), and users need to see
what compression bought them. :class:`CommState` provides both:

- the process group the hook talks over (``None``: the default group);
- ``iter``, the number of completed steps (one step ends with the bucket for
  which ``bucket.is_last()`` is true);
- memory kept per parameter, not per bucket. DDP regroups parameters into
  new buckets after its first iteration (and again in every new process
  after a restore), so ``bucket.index()`` does not name the same
  parameters over time; memory attached to the parameters is simply
  regrouped with them. Hooks read and write it as flat tensors laid out
  like the bucket (:meth:`CommState.flat_memory`);
- byte accounting: ``bytes_sent`` is what this rank put into collectives,
  ``bytes_uncompressed`` what a plain all-reduce of the same buckets would
  have put in, so ``compression_ratio = bytes_uncompressed / bytes_sent``;
- ``state_dict()`` / ``load_state_dict()`` for checkpointing (the process
  group is not part of it). Parameters are numbered in the order hooks
  first see them, which is the same in a new process training the same
  model with the same DDP settings; that number keys the saved memory.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary


class CommState:
    """Process group, step counter, per-parameter memory and byte counts.

    Also accepted by :func:`allreduce_hook`, :func:`fp16_compress_hook` and
    :func:`bf16_compress_hook` in place of a process group, to count their
    bytes too.
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None):
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise TypeError(f"process_group must be a ProcessGroup or None, got {type(process_group).__name__}")
        self.process_group = process_group
        self.iter = 0
        self.bytes_sent = 0
        self.bytes_uncompressed = 0
        self.last_step_bytes_sent = 0
        self.last_step_bytes_uncompressed = 0
        self._step_sent = 0
        self._step_uncompressed = 0
        self._numbers = WeakIdKeyDictionary()  # parameter -> number, in order of first sight
        self._next_number = 0
        self._memory: dict[int, dict[str, torch.Tensor]] = {}  # number -> named tensors

    # -- group ---------------------------------------------------------------

    def group(self) -> dist.ProcessGroup:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def world_size(self) -> int:
        return dist.get_world_size(self.group())

    # -- accounting ----------------------------------------------------------

    @property
    def compression_ratio(self) -> float:
        """Uncompressed bytes / bytes sent, over all steps so far (1.0 before any)."""
        return self.bytes_uncompressed / self.bytes_sent if self.bytes_sent else 1.0

    def account(self, bucket: dist.GradBucket, sent: int) -> None:
        """Records ``sent`` bytes for ``bucket`` and, on the step's last
        bucket, closes the step (``iter`` += 1). Hooks call it from the hook
        call itself, so the count never depends on when futures complete."""
        self._number(bucket)  # also on plain steps: numbers follow DDP's first iteration
        self._step_sent += sent
        self._step_uncompressed += bucket.buffer().numel() * bucket.buffer().element_size()
        if bucket.is_last():
            self.bytes_sent += self._step_sent
            self.bytes_uncompressed += self._step_uncompressed
            self.last_step_bytes_sent, self.last_step_bytes_uncompressed = self._step_sent, self._step_uncompressed
            self._step_sent = self._step_uncompressed = 0
            self.iter += 1

    # -- per-parameter memory ------------------------------------------------

    def _number(self, bucket: dist.GradBucket) -> list[int]:
        out = []
        for p in bucket.parameters():
            if p not in self._numbers:
                self._numbers[p] = self._next_number
                self._next_number += 1
            out.append(self._numbers[p])
        return out

    def memory(self, bucket: dist.GradBucket) -> list[dict[str, torch.Tensor]]:
        """One dict of named tensors per parameter of ``bucket``, in bucket
        order, for the hook to read and fill. Tensors loaded from a
        checkpoint are moved to the bucket's device here."""
        device = bucket.buffer().device
        out = []
        for n in self._number(bucket):
            mem = self._memory.setdefault(n, {})
            for name, t in mem.items():
                if t.device != device:
                    mem[name] = t.to(device)
            out.append(mem)
        return out

    def flat_memory(self, bucket: dist.GradBucket, name: str) -> torch.Tensor | None:
        """The per-parameter tensors called ``name`` laid out like the
        bucket's buffer (zeros for parameters that have none yet), or None
        if no parameter of the bucket has one."""
        mems = self.memory(bucket)
        if not any(name in m for m in mems):
            return None
        buf = bucket.buffer()
        return torch.cat([
            m[name].reshape(-1) if name in m and m[name].numel() == p.numel()
            else torch.zeros(p.numel(), dtype=buf.dtype, device=buf.device)
            for p, m in zip(bucket.parameters(), mems)
        ])

    def add_error(self, bucket: dist.GradBucket, buf: torch.Tensor) -> None:
        """Error feedback: adds to ``buf`` (the bucket's gradient) what
        compression left out of it last time, if anything."""
        err = self.flat_memory(bucket, "error")
        if err is not None:
            buf.add_(err)

    def set_flat_memory(self, bucket: dist.GradBucket, name: str, flat: torch.Tensor) -> None:
        """Stores ``flat`` (laid out like the bucket) per parameter, as views."""
        off = 0
        for p, m in zip(bucket.parameters(), self.memory(bucket)):
            m[name] = flat[off:off + p.numel()].view(p.shape)
            off += p.numel()

    # -- checkpointing -------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit after a restore:
        counters and per-parameter memory (tensors copied). Subclasses add
        their own entries by overriding :meth:`_extra_state`."""
        return {
            "iter": self.iter,
            "bytes_sent": self.bytes_sent,
            "bytes_uncompressed": self.bytes_uncompressed,
            "memory": {n: {k: t.detach().clone() for k, t in mem.items()} for n, mem in self._memory.items()},
            **self._extra_state(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restores counters and memory. Parameters this state has already
        seen keep their numbers; a new process numbers them as hooks see
        them, as the saving process did."""
        self.iter = int(sd["iter"])
        self.bytes_sent = int(sd["bytes_sent"])
        self.bytes_uncompressed = int(sd["bytes_uncompressed"])
        self._step_sent = self._step_uncompressed = 0
        self._memory = {int(n): {k: t.clone() for k, t in mem.items()} for n, mem in sd["memory"].items()}
        self._load_extra_state(sd)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, sd: dict[str, Any]) -> None:
        pass

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(iter={self.iter}, bytes_sent={self.bytes_sent}, "
                f"compression_ratio={self.compression_ratio:.2f})")


def pack(*parts: torch.Tensor) -> torch.Tensor:
    """The parts' bytes back to back, as one uint8 tensor: one collective
    can then carry values of several dtypes."""
    return torch.cat([p.contiguous().view(-1).view(torch.uint8) for p in parts])


def unpack(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes (the last dimension of ``raw``) reinterpreted as ``dtype``. A
    fresh copy: a slice of a gathered payload may not be aligned for it."""
    return torch.empty(raw.shape, dtype=torch.uint8, device=raw.device).copy_(raw).view(dtype)


def resolve(state: Any) -> tuple[dist.ProcessGroup, CommState | None]:
    """(group, accounting state) for hooks whose state may be a process
    group, ``None`` (default group) or a :class:`CommState`."""
    if isinstance(state, CommState):
        return state.group(), state
    return (state if state is not None else dist.group.WORLD), None
