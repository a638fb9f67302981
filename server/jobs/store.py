"""The durable part of batch jobs: files, batches and each request's result, in one SQLite
database (WAL, one connection, one writer) with the files' bytes beside it.

A result is committed the moment it arrives, in the same row as its request, so a restart
finds exactly which requests are still to run: a request is done if and only if its row has a
status code or an error. Every file and batch names its owner (server/auth.py's owner id); a
lookup given an owner sees only that owner's rows. Nothing here knows about HTTP or the engine.
Every call may block on the disk: the server makes them on its store thread (store_thread.py).
"""
from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from server.jobs.disk import PART_SUFFIX, UNWRITABLE_ERRNOS, write_whole
from server.jobs.sqlite_db import Transaction, open_database

# Statuses as OpenAI names them. A batch moves validating -> in_progress -> finalizing ->
# completed, or ends failed (validation), expired (past its window) or cancelled.
VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED = "validating", "in_progress", "finalizing", "completed"
FAILED, EXPIRED, CANCELLING, CANCELLED = "failed", "expired", "cancelling", "cancelled"
ACTIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)
ENDED = (COMPLETED, FAILED, EXPIRED, CANCELLED)
_STAMP = {IN_PROGRESS: "in_progress_at", FINALIZING: "finalizing_at", COMPLETED: "completed_at",
          FAILED: "failed_at", EXPIRED: "expired_at", CANCELLING: "cancelling_at", CANCELLED: "cancelled_at"}
ANONYMOUS = "anonymous"  # the owner of everything on a server without keys
_FILE_COLUMNS = ("id", "purpose", "filename", "bytes", "created_at", "owner")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL, owner TEXT NOT NULL DEFAULT '{ANONYMOUS}');
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, created_seq INTEGER NOT NULL UNIQUE, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, in_progress_at INTEGER,
    finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER, expired_at INTEGER,
    cancelling_at INTEGER, cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT,
    errors TEXT, metadata TEXT, owner TEXT NOT NULL DEFAULT '{ANONYMOUS}');
CREATE TABLE IF NOT EXISTS requests (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, body TEXT NOT NULL,
    status_code INTEGER, request_id TEXT, response TEXT, error TEXT,
    PRIMARY KEY (batch_id, line), UNIQUE (batch_id, custom_id));
CREATE INDEX IF NOT EXISTS requests_pending ON requests (batch_id, status_code, line);
CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, at REAL NOT NULL);
"""


def default_data_dir() -> Path:
    """Where `cobatch serve` keeps jobs unless told otherwise: the user's data directory."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "cobatch"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def to_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class StoredFile:
    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    owner: str = ANONYMOUS

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": None, "status_details": None}


@dataclass(frozen=True)
class PendingRequest:
    batch_id: str
    line: int
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """What one request came to: an HTTP answer (status and body), or an error with no answer
    (the batch expired or was cancelled before the request ran, or its result could not be stored)."""

    status_code: int | None
    request_id: str | None = None
    response: dict[str, Any] | None = None
    error: dict[str, str] | None = None


@dataclass(frozen=True)
class StoredOutcome:
    """A finished request as stored: its response and error still JSON text, as the output files
    take them (no parsing of large bodies while finalizing)."""

    line: int
    custom_id: str
    status_code: int | None
    request_id: str | None
    response_json: str | None
    error_json: str | None


class JobStore:
    def __init__(self, data_dir: str | Path, busy_timeout_s: float = 5.0) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.files_dir = self.data_dir / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = open_database(self.data_dir / "jobs.sqlite3", busy_timeout_s)
        self._db.executescript(_SCHEMA)
        for table in ("files", "batches"):  # a store made before files and batches had owners
            if "owner" not in {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT NOT NULL DEFAULT '{ANONYMOUS}'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def check_writable(self) -> None:
        """A small write that raises if the database cannot take writes now (full, read-only, locked)."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO probe (id, at) VALUES (1, ?)", (time.time(),))

    # ---- files --------------------------------------------------------------------------------
    def add_file(self, purpose: str, filename: str, chunks: Iterable[bytes], *, owner: str = ANONYMOUS,
                 file_id: str | None = None) -> StoredFile:
        """Store a file whole (a given id replaces any file of that id). Whatever `chunks` raises
        (an upload over its limit) leaves nothing behind."""
        file_id = file_id or new_id("file")
        size = write_whole(self.file_path(file_id), chunks)
        return self.add_file_row(StoredFile(file_id, purpose, filename, size, int(time.time()), owner))

    def add_file_row(self, stored: StoredFile) -> StoredFile:
        """Record a file already written whole at file_path(stored.id)."""
        with self._write() as db:
            db.execute(f"INSERT OR REPLACE INTO files ({', '.join(_FILE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)",
                       (stored.id, stored.purpose, stored.filename, stored.bytes, stored.created_at, stored.owner))
        return stored

    def file(self, file_id: str, *, owner: str | None = None) -> StoredFile | None:
        """The file, if it exists and (given an owner) belongs to that owner."""
        row = self._one("SELECT * FROM files WHERE id = ? AND (? IS NULL OR owner = ?)", (file_id, owner, owner))
        return None if row is None else StoredFile(**dict(row))

    def files(self, purpose: str | None, *, owner: str | None = None) -> list[StoredFile]:
        """Every file (of one purpose, of one owner), newest first."""
        rows = self._all("SELECT * FROM files WHERE (? IS NULL OR purpose = ?) AND (? IS NULL OR owner = ?) "
                         "ORDER BY created_at DESC, id", (purpose, purpose, owner, owner))
        return [StoredFile(**dict(r)) for r in rows]

    def file_path(self, file_id: str) -> Path:
        if not file_id.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"not a file id: {file_id!r}")  # ids name files on disk
        return self.files_dir / f"{file_id}.jsonl"

    def delete_file(self, file_id: str, *, owner: str | None = None) -> bool:
        with self._write() as db:
            deleted = db.execute("DELETE FROM files WHERE id = ? AND (? IS NULL OR owner = ?)",
                                 (file_id, owner, owner)).rowcount > 0
        if deleted:  # a crash before this unlink leaves a file no row names: sweep_files removes it
            self.file_path(file_id).unlink(missing_ok=True)
        return deleted

    def sweep_files(self) -> list[str]:
        """Remove what a crash can leave in the files directory: part files, and files no row names
        (written but never recorded, or deleted before the unlink). Call it only while no upload or
        finalize runs (at start). Returns the names removed."""
        known = {r["id"] for r in self._all("SELECT id FROM files", ())}
        removed = []
        for path in self.files_dir.iterdir():
            if path.name.endswith(PART_SUFFIX) or (path.suffix == ".jsonl" and path.stem not in known):
                path.unlink(missing_ok=True)
                removed.append(path.name)
        return removed

    # ---- batches ------------------------------------------------------------------------------
    def add_batch(self, endpoint: str, input_file_id: str, completion_window_s: int, window: str,
                  metadata: dict[str, str] | None, *, owner: str = ANONYMOUS) -> str:
        batch_id = new_id("batch")
        now = int(time.time())
        with self._write() as db:
            seq = db.execute("SELECT COALESCE(MAX(created_seq), 0) + 1 FROM batches").fetchone()[0]
            db.execute(
                "INSERT INTO batches (id, created_seq, endpoint, input_file_id, completion_window, status, "
                "created_at, expires_at, metadata, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_id, seq, endpoint, input_file_id, window, VALIDATING, now, now + completion_window_s,
                 to_json(metadata), owner),
            )
        return batch_id

    def batch(self, batch_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        """The batch as OpenAI shows it (request counts included), if it exists and (given an owner)
        belongs to that owner."""
        row = self._one("SELECT * FROM batches WHERE id = ? AND (? IS NULL OR owner = ?)", (batch_id, owner, owner))
        return None if row is None else self._batch_object(row)

    def batch_row(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's own columns, without counting its requests (the runner's every-round read)."""
        row = self._one("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return None if row is None else dict(row)

    def batches(self, limit: int, after: str | None, *, owner: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """Newest first, up to `limit` after the batch `after`; and whether more follow."""
        sql, args = "SELECT * FROM batches WHERE (? IS NULL OR owner = ?)", [owner, owner]
        if after is not None:
            sql += " AND created_seq < (SELECT created_seq FROM batches WHERE id = ?)"
            args.append(after)
        rows = self._all(sql + " ORDER BY created_seq DESC LIMIT ?", (*args, limit + 1))
        return [self._batch_object(r) for r in rows[:limit]], len(rows) > limit

    def batch_ids(self, statuses: Iterable[str]) -> list[str]:
        statuses = tuple(statuses)
        marks = ",".join("?" * len(statuses))
        return [r["id"] for r in self._all(f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY created_seq",
                                           statuses)]

    def set_status(self, batch_id: str, status: str, *, only_from: Iterable[str] | None = None, **columns: Any) -> bool:
        """Move a batch to `status` (stamping its time), if it is in one of `only_from`."""
        with self._write() as db:
            return self._set_status(db, batch_id, status, only_from, columns)

    def fail_validation(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        self.set_status(batch_id, FAILED, only_from=(VALIDATING,), errors=to_json({"object": "list", "data": errors}))

    def start(self, batch_id: str, requests: Iterable[tuple[str, dict[str, Any]]]) -> bool:
        """Store a validated batch's requests and move it to in_progress, in one transaction.
        `requests` may be a generator: it is consumed as the rows go in, never held whole."""
        with self._write() as db:
            status = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if status is None or status[0] != VALIDATING:
                return False
            rows = ((batch_id, i, cid, to_json(body)) for i, (cid, body) in enumerate(requests))
            db.executemany("INSERT INTO requests (batch_id, line, custom_id, body) VALUES (?, ?, ?, ?)", rows)
            self._set_status(db, batch_id, IN_PROGRESS, None, {})
        return True

    def finish(self, batch_id: str, final: str, only_from: Iterable[str], output_file_id: str | None,
               error_file_id: str | None) -> bool:
        """End a batch with its files. Every request must have its outcome first: a batch with a
        request still open is never ended (False; a completed batch goes back to in_progress)."""
        with self._write() as db:
            if self._unfinished(db, batch_id):
                if final == COMPLETED:
                    self._set_status(db, batch_id, IN_PROGRESS, only_from, {})
                return False
            return self._set_status(db, batch_id, final, only_from,
                                    {"output_file_id": output_file_id, "error_file_id": error_file_id})

    # ---- requests -----------------------------------------------------------------------------
    def pending(self, batch_id: str, after_line: int, limit: int) -> list[PendingRequest]:
        rows = self._all("SELECT line, custom_id, body FROM requests WHERE batch_id = ? AND status_code IS NULL "
                         "AND error IS NULL AND line > ? ORDER BY line LIMIT ?", (batch_id, after_line, limit))
        return [PendingRequest(batch_id, r["line"], r["custom_id"], json.loads(r["body"])) for r in rows]

    def unfinished(self, batch_id: str) -> int:
        """Requests of the batch still without an outcome."""
        with self._lock:
            return self._unfinished(self._db, batch_id)

    def record(self, batch_id: str, line: int, outcome: Outcome) -> bool:
        """Commit one request's outcome; False if it already had one (it is never overwritten)."""
        response, error = to_json(outcome.response), to_json(outcome.error)
        with self._write() as db:
            return db.execute(
                "UPDATE requests SET status_code = ?, request_id = ?, response = ?, error = ? "
                "WHERE batch_id = ? AND line = ? AND status_code IS NULL AND error IS NULL",
                (outcome.status_code, outcome.request_id, response, error, batch_id, line),
            ).rowcount > 0

    def end_unfinished(self, batch_id: str, code: str, message: str) -> None:
        """Give every request still pending an error outcome (the batch expired or was cancelled)."""
        with self._write() as db:
            db.execute("UPDATE requests SET error = ? WHERE batch_id = ? AND status_code IS NULL AND error IS NULL",
                       (to_json({"code": code, "message": message}), batch_id))

    def counts(self, batch_id: str) -> dict[str, int]:
        row = self._one(
            "SELECT COUNT(*) AS total, COALESCE(SUM(status_code = 200), 0) AS completed, "
            "COALESCE(SUM((status_code IS NOT NULL AND status_code != 200) OR error IS NOT NULL), 0) AS failed "
            "FROM requests WHERE batch_id = ?", (batch_id,))
        return {"total": row["total"], "completed": row["completed"], "failed": row["failed"]}

    def outcome_page(self, batch_id: str, after_line: int, limit: int) -> list[StoredOutcome]:
        """Up to `limit` finished requests after `after_line`, in line order: the output files are
        written a page at a time, never the whole batch in memory."""
        rows = self._all("SELECT line, custom_id, status_code, request_id, response, error FROM requests "
                         "WHERE batch_id = ? AND line > ? AND (status_code IS NOT NULL OR error IS NOT NULL) "
                         "ORDER BY line LIMIT ?", (batch_id, after_line, limit))
        return [StoredOutcome(r["line"], r["custom_id"], r["status_code"], r["request_id"], r["response"], r["error"])
                for r in rows]

    # ---- plumbing -----------------------------------------------------------------------------
    def _batch_object(self, row: sqlite3.Row) -> dict[str, Any]:
        batch = dict(row)
        batch.pop("created_seq")
        batch.pop("owner")
        batch["object"] = "batch"
        batch["errors"] = None if batch["errors"] is None else json.loads(batch["errors"])
        batch["metadata"] = None if batch["metadata"] is None else json.loads(batch["metadata"])
        batch["request_counts"] = self.counts(batch["id"])
        return batch

    @staticmethod
    def _unfinished(db: sqlite3.Connection, batch_id: str) -> int:
        return db.execute("SELECT COUNT(*) FROM requests WHERE batch_id = ? AND status_code IS NULL AND error IS NULL",
                          (batch_id,)).fetchone()[0]

    @staticmethod
    def _set_status(db: sqlite3.Connection, batch_id: str, status: str, only_from: Iterable[str] | None,
                    columns: dict[str, Any]) -> bool:
        values = dict(columns)
        if status in _STAMP:
            values[_STAMP[status]] = int(time.time())
        values["status"] = status
        sets = ", ".join(f"{name} = ?" for name in values)
        sql, args = f"UPDATE batches SET {sets} WHERE id = ?", [*values.values(), batch_id]
        if only_from is not None:
            allowed = tuple(only_from)
            sql += f" AND status IN ({','.join('?' * len(allowed))})"
            args += allowed
        return db.execute(sql, args).rowcount > 0

    def _one(self, sql: str, args: tuple) -> sqlite3.Row | None:
        with self._lock:
            return self._db.execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self) -> Transaction:
        return Transaction(self._db, self._lock)


def store_unavailable(exc: BaseException) -> bool:
    """Whether `exc` means the store cannot take writes for now (a full disk, a read-only or
    locked database, a failing device), as opposed to a fault of the data being written."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    return isinstance(exc, OSError) and exc.errno in UNWRITABLE_ERRNOS
