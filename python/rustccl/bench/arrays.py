"""The arrays of one benchmark point, and one call of an op on them
through rustccl's numpy ``Communicator`` (``python -m rustccl.bench.mpi``
and the tuner, ``rustccl.tune``, time the same calls)."""

from __future__ import annotations

import numpy as np


class Buffers:
    """One system's arrays for one point: `x` (n elements per rank),
    `big` (n x world, also seen as `parts`) and `other` (n x world). With
    `fill`, every element is distinct and names its rank (for --check)."""

    def __init__(self, nbytes: int, rank: int, world: int, fill: bool):
        n = max(1, nbytes // 4)
        if fill:
            self.x = np.arange(n, dtype=np.float32) + 1000 * rank
            self.big = np.arange(n * world, dtype=np.float32) + 1000 * rank
        else:
            self.x, self.big = np.zeros(n, np.float32), np.zeros(n * world, np.float32)
        self.parts = [self.big[i * n:(i + 1) * n] for i in range(world)]
        self.other = np.zeros(n * world, np.float32)

    def output(self, op: str, rank: int) -> np.ndarray | None:
        """What `op` left on this rank that it defines (None: nothing)."""
        if op in ("all_gather",) or (op == "gather" and rank == 0):
            return self.big
        if op == "all_to_all":
            return self.other
        if op in ("reduce", "gather") and rank != 0:
            return None
        if op == "send_recv" and rank > 1:
            return None
        return self.x


def communicator_call(comm, op: str, b: Buffers, rank: int):
    """One call of `op` through the ``Communicator`` `comm` on the arrays
    `b`, as a closure."""
    x, big, other = b.x, b.big, b.other
    root = rank == 0
    return {
        "all_reduce": lambda: comm.all_reduce(x),
        "all_gather": lambda: comm.all_gather(big, x),
        "reduce_scatter": lambda: comm.reduce_scatter(x, big),
        "broadcast": lambda: comm.broadcast(x, 0),
        "reduce": lambda: comm.reduce(x, 0),
        "gather": lambda: comm.gather(x, big if root else None, 0),
        "scatter": lambda: comm.scatter(x, big if root else None, 0),
        "all_to_all": lambda: comm.all_to_all(other, big),
        "send_recv": lambda: pingpong(rank, lambda: comm.send(x, 1 - rank), lambda: comm.recv(x, 1 - rank)),
    }[op]


def pingpong(rank: int, send, recv) -> None:
    """Ranks 0 and 1 exchange one message each way (other ranks idle)."""
    if rank == 0:
        send()
        recv()
    elif rank == 1:
        recv()
        send()
