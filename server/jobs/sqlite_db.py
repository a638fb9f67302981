"""The data directory's SQLite conventions, shared by every store kept there (batch jobs,
stored responses): one connection per database, WAL, and each write a transaction of its own
behind one lock, rolled back whatever fails."""
from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("cobatch.store")


def open_database(path: Path, busy_timeout_s: float = 5.0) -> sqlite3.Connection:
    """A connection any thread may use (callers serialise through their lock), in autocommit mode
    so that Transaction alone opens and ends transactions."""
    db = sqlite3.connect(path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    # WAL: a committed row survives the process being killed; readers never block the writer.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class Transaction:
    """One writer at a time, and each write a transaction of its own. Whatever fails (BEGIN,
    the work, COMMIT), the transaction is rolled back and the lock released: a store error never
    leaves the store locked."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db = db
        self._lock = lock

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._rollback()  # left open only if an earlier ROLLBACK itself failed
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        return self._db

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        try:
            if kind is None:
                try:
                    self._db.execute("COMMIT")
                except BaseException:
                    self._rollback()
                    raise
            else:
                self._rollback()
        finally:
            self._lock.release()

    def _rollback(self) -> None:
        if not self._db.in_transaction:  # SQLite already rolled back (a full disk can do that)
            return
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception("ROLLBACK failed")
