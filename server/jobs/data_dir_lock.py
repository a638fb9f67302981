"""One process per data directory: an exclusive lock on DATA_DIR/cobatch.lock, held while a server runs.

Two servers on one directory would run the same pending requests twice and finalize a batch into
the same file; the second is refused at once, told which process holds the directory. The lock is
the kernel's (flock), so it ends with its holder however that ends, SIGKILL included.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "cobatch.lock"


class DataDirInUse(RuntimeError):
    """Another process holds the data directory."""


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir).expanduser() / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(f"the data directory {self.path.parent} is in use by another cobatch process "
                               f"(pid {holder}); stop it or give this one another --data-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
