"""A dependency-free progress bar on stderr (rank 0 only).

Shown when stderr is a terminal, or always with ``--progress``; never with
``--no-progress``. One line redrawn with ``\\r``:

    [##########..........]  12/48  0:07  rustccl all_reduce 2 MiB
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, enabled: bool, stream=None, width: int = 24):
        self.total = max(total, 1)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.width = width
        self.done = 0
        self.label = ""
        self.t0 = time.monotonic()
        self._last_len = 0

    def update(self, label: str) -> None:
        """Names the point being measured now."""
        self.label = label
        self._draw()

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self._draw()

    def close(self) -> None:
        if self.enabled:
            self.label = "done"
            self._draw()
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        secs = int(time.monotonic() - self.t0)
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done:>{len(str(self.total))}}/{self.total}"
                f"  {secs // 60}:{secs % 60:02d}  {self.label}")
        pad = max(0, self._last_len - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._last_len = len(line)


class Null(Progress):
    """Non-zero ranks: counts, draws nothing."""

    def __init__(self, total: int = 1):
        super().__init__(total, enabled=False)
