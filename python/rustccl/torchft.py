"""rustccl as torchft's reconfigurable process group.

torchft (``pip install rustccl[torchft]``) forms a quorum of replicas at
every step and calls ``configure()`` on each replica's process group when
the quorum changes. :class:`ProcessGroupRustccl` is that process group over
rustccl, for CPU and CUDA tensors, in torchft's own wrapper style::

    from rustccl.torchft import ProcessGroupRustccl
    from torchft import Manager

    manager = Manager(pg=ProcessGroupRustccl(), ...)

``configure()`` aborts the previous group at once (its work in flight
fails, nothing waits for its timeout) and builds a fresh rustccl group
from the new store address; ``errored()`` reports the error that left the
group unusable (a peer's link broke, a timeout, an abort), which torchft's
Manager turns into a skipped step and a reconfiguration. As with torchft's
NCCL group, a failed operation's ``wait()`` returns False instead of raising:
torchft learns of the failure from ``errored()`` and from the work's future
(which holds the error), and skips the step; its DDP hook cannot take an
exception from ``wait()``.
"""

from __future__ import annotations

from datetime import timedelta

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torch.distributed import Store, Work
from torchft.process_group import ProcessGroupWrapper

from ._rustccl import Communicator
from .backend import new_process_group
from .compression import CODECS
from .options import Options

__all__ = ["ProcessGroupRustccl"]


class ProcessGroupRustccl(ProcessGroupWrapper):
    """A reconfigurable rustccl process group for torchft.

    Args:
        timeout: the store's and every collective's timeout.
        options: the groups' own rustccl settings (as ``pg_options``).
        compression: every group's codec for float SUM / AVG all-reduces
            between hosts ("bf16", "fp16", "int8"; see
            ``rustccl.set_compression``), e.g. DiLoCo's outer
            synchronisation over a slow link. None: exact.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60), options: Options | None = None,
                 compression: str | None = None) -> None:
        super().__init__(timeout=timeout)
        if compression is not None and compression not in CODECS:
            raise ValueError(f"rustccl.torchft: compression {compression!r} is not one of {CODECS}")
        self._options = options
        self._compression = compression
        self._comm: Communicator | None = None
        self._errored: Exception | None = None
        # Which configuration a work belongs to: a late failure of an old
        # group's work must not mark the new group errored.
        self._generation = 0

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        self._errored = None
        self._generation += 1
        pg, self._comm = new_process_group(store, rank, world_size, self._timeout, self._quorum_group(), self._options)
        if self._compression is not None:
            self._comm.set_compression(self._compression)
        return pg

    def _quorum_group(self) -> str:
        # The same on every replica of one quorum (torchft's own naming),
        # new at each quorum: logs and flight records tell them apart.
        group_rank, group_size = self._group_rank or 0, self._group_world_size or 1
        return f"torchft_quorum_{self._quorum_id}_rank_{group_rank % group_size}"

    def _wrap_work(self, work: Work, opts: object) -> Work:
        return _Work(self, work, self._generation)

    def _failed(self, e: Exception, generation: int) -> None:
        if self._errored is None and generation == self._generation:
            self._errored = e

    def abort(self, errored: bool = True) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            if errored:
                self._errored = RuntimeError("rustccl: the torchft process group was aborted")
            # Interrupts a collective waiting on a peer now; later calls on
            # the old group fail at once.
            comm.shutdown(abort=True)
        super().abort(errored=errored)

    def shutdown(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.shutdown(abort=False)
        super().shutdown()

    def errored(self) -> Exception | None:
        if self._errored is not None:
            return self._errored
        comm = self._comm
        cause = comm.error() if comm is not None else None
        return RuntimeError(cause) if cause is not None else None

    def getBackendName(self) -> str:
        return "torchft-rustccl"


class _Work(Work):
    """A rustccl work whose ``wait()`` reports a failure to the process
    group's ``errored()`` and returns False; its future keeps the error."""

    def __init__(self, pg: ProcessGroupRustccl, work: Work, generation: int) -> None:
        super().__init__()
        self._pg = pg
        self._work = work
        self._generation = generation

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except Exception as e:  # noqa: BLE001 - reported through errored()
            self._pg._failed(e, self._generation)
            return False

    def get_future(self) -> torch.futures.Future[object]:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def synchronize(self) -> None:
        self._work.synchronize()
