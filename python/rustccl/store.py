"""A file-based key-value store for ``rustccl.Communicator`` without
torch.distributed: every rank points at the same directory (on one host, or
on a shared file system). Any object with ``set``, ``get`` and ``add`` works
in its place, torch's stores included."""

from __future__ import annotations

import os
import time
import fcntl


class FileStore:
    def __init__(self, path: str, timeout: float = 300.0):
        self.path = path
        self.timeout = timeout
        os.makedirs(path, exist_ok=True)

    def _file(self, key: str) -> str:
        safe = key.replace("%", "%25").replace("/", "%2F")
        return os.path.join(self.path, safe)

    def set(self, key: str, value) -> None:
        if isinstance(value, str):
            value = value.encode()
        final = self._file(key)
        tmp = f"{final}.tmp.{os.getpid()}.{time.monotonic_ns()}"
        with open(tmp, "wb") as f:
            f.write(bytes(value))
        os.replace(tmp, final)

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout
        path = self._file(key)
        delay = 0.001
        while True:
            try:
                with open(path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rustccl FileStore: Timed out waiting for key {key!r} in {self.path}")
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def add(self, key: str, amount: int) -> int:
        lock = self._file(key) + ".lock"
        with open(lock, "a+") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                try:
                    with open(self._file(key), "rb") as f:
                        value = int(f.read() or b"0")
                except FileNotFoundError:
                    value = 0
                value += int(amount)
                self.set(key, str(value))
                return value
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)
