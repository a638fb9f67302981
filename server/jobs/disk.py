"""Files on disk that are whole or absent: written under a temporary name, synced, renamed, and the
directory synced so the rename itself survives a power loss."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Iterable

PART_SUFFIX = ".part"
# Errors that mean "the disk cannot take this now" (full, quota, read-only, failing), not "this is wrong".
UNWRITABLE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def sync_directory(directory: Path) -> None:
    """fsync a directory, so that a rename or creation in it is durable (a no-op where the OS
    cannot open directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):  # some file systems cannot sync directories
            raise
    finally:
        os.close(fd)


class PartFile:
    """Bytes written to PATH.part and renamed to PATH by `commit`; `abort` (or an exception inside
    `with`) removes the part file, so PATH is never seen half written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.part = path.with_name(path.name + PART_SUFFIX)
        self.size = 0
        self._out = open(self.part, "wb")

    def write(self, data: bytes) -> None:
        self._out.write(data)
        self.size += len(data)

    def commit(self) -> int:
        """Sync, rename into place, sync the directory; returns the size."""
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        os.replace(self.part, self.path)
        sync_directory(self.path.parent)
        return self.size

    def abort(self) -> None:
        if not self._out.closed:
            self._out.close()
        self.part.unlink(missing_ok=True)

    def __enter__(self) -> "PartFile":
        return self

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        if kind is not None or not self._out.closed:
            self.abort()


def write_whole(path: Path, chunks: Iterable[bytes]) -> int:
    """Write `chunks` to `path` whole or not at all; returns the size. Whatever `chunks` raises
    (an upload over its limit) leaves nothing behind."""
    with PartFile(path) as out:
        for chunk in chunks:
            out.write(chunk)
        return out.commit()
