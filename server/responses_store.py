"""Stored responses (/v1/responses with `store`): each response with the input items it was
generated from, in DATA_DIR/responses.sqlite3.

The data directory's conventions (server/jobs/sqlite_db.py): WAL, one connection, one writer,
each write one transaction; one process owns the directory (its lock, taken by Jobs.open before
this store is opened). A database of its own rather than the jobs' tables: a batch's large
writes (50,000 request rows in one transaction) never hold up a chat turn's one-row write.

A response's `items` are its whole context as the API lists it (input_items): the earlier
response's items and output, then its own input, so a continuation reads one row, and deleting
any response leaves every other one whole. A deleted id leaves a tombstone, so that a later
lookup can say "deleted" rather than "never existed". Every row names its owner (server/auth.py's
owner id); a lookup given an owner sees only that owner's rows. Every call may block on the disk:
the server makes them on a store thread (server/responses_keeper.py).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.jobs.sqlite_db import Transaction, open_database
from server.jobs.store import ANONYMOUS

DATABASE = "responses.sqlite3"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL DEFAULT '{ANONYMOUS}', created_at INTEGER NOT NULL,
    response TEXT NOT NULL, items TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS deleted_responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, deleted_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, at REAL NOT NULL);
"""


@dataclass(frozen=True)
class StoredResponse:
    """A response object as it was answered, and the items (its whole context) it was generated from."""

    id: str
    owner: str
    response: dict[str, Any]
    items: list[dict[str, Any]]


class ResponseStore:
    def __init__(self, data_dir: str | Path, busy_timeout_s: float = 5.0) -> None:
        directory = Path(data_dir).expanduser()
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = open_database(directory / DATABASE, busy_timeout_s)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def check_writable(self) -> None:
        """A small write that raises if the database cannot take writes now (full, read-only, locked)."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO probe (id, at) VALUES (1, ?)", (time.time(),))

    def put(self, stored: StoredResponse) -> None:
        """Keep a response (once: a response id is never reused, so a second put of it replaces
        the same content, as a retry after an unknown outcome may)."""
        response = json.dumps(stored.response, ensure_ascii=False)
        items = json.dumps(stored.items, ensure_ascii=False)
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO responses (id, owner, created_at, response, items) VALUES (?, ?, ?, ?, ?)",
                       (stored.id, stored.owner, int(stored.response.get("created_at") or time.time()), response, items))

    def get(self, response_id: str, *, owner: str | None = None) -> StoredResponse | None:
        """The response, if it is kept and (given an owner) belongs to that owner."""
        with self._lock:
            row = self._db.execute("SELECT * FROM responses WHERE id = ? AND (? IS NULL OR owner = ?)",
                                   (response_id, owner, owner)).fetchone()
        if row is None:
            return None
        return StoredResponse(row["id"], row["owner"], json.loads(row["response"]), json.loads(row["items"]))

    def was_deleted(self, response_id: str, *, owner: str | None = None) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM deleted_responses WHERE id = ? AND (? IS NULL OR owner = ?)",
                                    (response_id, owner, owner)).fetchone() is not None

    def delete(self, response_id: str, *, owner: str | None = None) -> bool:
        """Remove the response (leaving a tombstone); False if there was none to remove."""
        with self._write() as db:
            row = db.execute("SELECT owner FROM responses WHERE id = ? AND (? IS NULL OR owner = ?)",
                             (response_id, owner, owner)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            db.execute("INSERT OR REPLACE INTO deleted_responses (id, owner, deleted_at) VALUES (?, ?, ?)",
                       (response_id, row["owner"], int(time.time())))
        return True

    def _write(self) -> Transaction:
        return Transaction(self._db, self._lock)
