"""The durable part of batch jobs: files, batches and each request's result, in one SQLite
database (WAL, one connection, one writer) with the files' bytes beside it.

A result is committed the moment it arrives, in the same row as its request, so a restart
finds exactly which requests are still to run: a request is done if and only if its row has a
status code. Nothing here knows about HTTP or the engine.
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
from typing import Any, Iterable, Iterator

# Statuses as OpenAI names them. A batch moves validating -> in_progress -> finalizing ->
# completed, or ends failed (validation), expired (past its window) or cancelled.
VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED = "validating", "in_progress", "finalizing", "completed"
FAILED, EXPIRED, CANCELLING, CANCELLED = "failed", "expired", "cancelling", "cancelled"
ACTIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)
ENDED = (COMPLETED, FAILED, EXPIRED, CANCELLED)
_STAMP = {IN_PROGRESS: "in_progress_at", FINALIZING: "finalizing_at", COMPLETED: "completed_at",
          FAILED: "failed_at", EXPIRED: "expired_at", CANCELLING: "cancelling_at", CANCELLED: "cancelled_at"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, created_seq INTEGER NOT NULL UNIQUE, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, in_progress_at INTEGER,
    finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER, expired_at INTEGER,
    cancelling_at INTEGER, cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT,
    errors TEXT, metadata TEXT);
CREATE TABLE IF NOT EXISTS requests (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, body TEXT NOT NULL,
    status_code INTEGER, request_id TEXT, response TEXT, error TEXT,
    PRIMARY KEY (batch_id, line), UNIQUE (batch_id, custom_id));
CREATE INDEX IF NOT EXISTS requests_pending ON requests (batch_id, status_code, line);
"""


def default_data_dir() -> Path:
    """Where `cobatch serve` keeps jobs unless told otherwise: the user's data directory."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "cobatch"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class StoredFile:
    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

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
    (the batch expired or was cancelled before the request ran)."""

    status_code: int | None
    request_id: str | None = None
    response: dict[str, Any] | None = None
    error: dict[str, str] | None = None


class JobStore:
    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.files_dir = self.data_dir / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.data_dir / "jobs.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        # WAL: a committed row survives the process being killed; readers never block the writer.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- files --------------------------------------------------------------------------------
    def add_file(self, purpose: str, filename: str, chunks: Iterable[bytes], file_id: str | None = None) -> StoredFile:
        """Store a file; a given id replaces any file of that id (a batch's output, rewritten
        whole if finalizing was interrupted)."""
        file_id = file_id or new_id("file")
        path = self.file_path(file_id)
        size = 0
        part = path.with_suffix(".part")
        try:
            with open(part, "wb") as out:
                for chunk in chunks:  # may raise (an upload over its limit): nothing is left behind
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        os.replace(part, path)  # a file is whole or absent, never partial
        stored = StoredFile(file_id, purpose, filename, size, int(time.time()))
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)",
                       (stored.id, stored.purpose, stored.filename, stored.bytes, stored.created_at))
        return stored

    def file(self, file_id: str) -> StoredFile | None:
        row = self._one("SELECT * FROM files WHERE id = ?", (file_id,))
        return None if row is None else StoredFile(**dict(row))

    def files(self, purpose: str | None) -> list[StoredFile]:
        """Every file (of one purpose), newest first."""
        if purpose is None:
            rows = self._all("SELECT * FROM files ORDER BY created_at DESC, id", ())
        else:
            rows = self._all("SELECT * FROM files WHERE purpose = ? ORDER BY created_at DESC, id", (purpose,))
        return [StoredFile(**dict(r)) for r in rows]

    def file_path(self, file_id: str) -> Path:
        if not file_id.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"not a file id: {file_id!r}")  # ids name files on disk
        return self.files_dir / f"{file_id}.jsonl"

    def delete_file(self, file_id: str) -> bool:
        with self._write() as db:
            deleted = db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0
        if deleted:
            self.file_path(file_id).unlink(missing_ok=True)
        return deleted

    # ---- batches ------------------------------------------------------------------------------
    def add_batch(self, endpoint: str, input_file_id: str, completion_window_s: int, window: str,
                  metadata: dict[str, str] | None) -> str:
        batch_id = new_id("batch")
        now = int(time.time())
        with self._write() as db:
            seq = db.execute("SELECT COALESCE(MAX(created_seq), 0) + 1 FROM batches").fetchone()[0]
            db.execute(
                "INSERT INTO batches (id, created_seq, endpoint, input_file_id, completion_window, status, "
                "created_at, expires_at, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_id, seq, endpoint, input_file_id, window, VALIDATING, now, now + completion_window_s,
                 None if metadata is None else json.dumps(metadata)),
            )
        return batch_id

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return None if row is None else self._batch_object(row)

    def batch_row(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's own columns, without counting its requests (the runner's every-round read)."""
        row = self._one("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return None if row is None else dict(row)

    def batches(self, limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
        """Newest first, up to `limit` after the batch `after`; and whether more follow."""
        if after is None:
            rows = self._all("SELECT * FROM batches ORDER BY created_seq DESC LIMIT ?", (limit + 1,))
        else:
            rows = self._all("SELECT * FROM batches WHERE created_seq < (SELECT created_seq FROM batches "
                             "WHERE id = ?) ORDER BY created_seq DESC LIMIT ?", (after, limit + 1))
        return [self._batch_object(r) for r in rows[:limit]], len(rows) > limit

    def batch_ids(self, statuses: Iterable[str]) -> list[str]:
        statuses = tuple(statuses)
        marks = ",".join("?" * len(statuses))
        return [r["id"] for r in self._all(f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY created_seq",
                                           statuses)]

    def set_status(self, batch_id: str, status: str, *, only_from: Iterable[str] | None = None, **columns: Any) -> bool:
        """Move a batch to `status` (stamping its time), if it is in one of `only_from`."""
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
        with self._write() as db:
            return db.execute(sql, args).rowcount > 0

    def fail_validation(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        self.set_status(batch_id, FAILED, only_from=(VALIDATING,),
                        errors=json.dumps({"object": "list", "data": errors}))

    def start(self, batch_id: str, requests: list[tuple[str, dict[str, Any]]]) -> bool:
        """Store a validated batch's requests and move it to in_progress, in one transaction."""
        with self._write() as db:
            status = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if status is None or status[0] != VALIDATING:
                return False
            db.executemany("INSERT INTO requests (batch_id, line, custom_id, body) VALUES (?, ?, ?, ?)",
                           ((batch_id, i, cid, json.dumps(body)) for i, (cid, body) in enumerate(requests)))
            db.execute("UPDATE batches SET status = ?, in_progress_at = ? WHERE id = ?",
                       (IN_PROGRESS, int(time.time()), batch_id))
        return True

    # ---- requests -----------------------------------------------------------------------------
    def pending(self, batch_id: str, after_line: int, limit: int) -> list[PendingRequest]:
        rows = self._all("SELECT line, custom_id, body FROM requests WHERE batch_id = ? AND status_code IS NULL "
                         "AND error IS NULL AND line > ? ORDER BY line LIMIT ?", (batch_id, after_line, limit))
        return [PendingRequest(batch_id, r["line"], r["custom_id"], json.loads(r["body"])) for r in rows]

    def record(self, batch_id: str, line: int, outcome: Outcome) -> bool:
        """Commit one request's outcome; False if it already had one (it is never overwritten)."""
        with self._write() as db:
            return db.execute(
                "UPDATE requests SET status_code = ?, request_id = ?, response = ?, error = ? "
                "WHERE batch_id = ? AND line = ? AND status_code IS NULL AND error IS NULL",
                (outcome.status_code, outcome.request_id,
                 None if outcome.response is None else json.dumps(outcome.response),
                 None if outcome.error is None else json.dumps(outcome.error), batch_id, line),
            ).rowcount > 0

    def end_unfinished(self, batch_id: str, code: str, message: str) -> None:
        """Give every request still pending an error outcome (the batch expired or was cancelled)."""
        with self._write() as db:
            db.execute("UPDATE requests SET error = ? WHERE batch_id = ? AND status_code IS NULL AND error IS NULL",
                       (json.dumps({"code": code, "message": message}), batch_id))

    def counts(self, batch_id: str) -> dict[str, int]:
        row = self._one(
            "SELECT COUNT(*) AS total, COALESCE(SUM(status_code = 200), 0) AS completed, "
            "COALESCE(SUM((status_code IS NOT NULL AND status_code != 200) OR error IS NOT NULL), 0) AS failed "
            "FROM requests WHERE batch_id = ?", (batch_id,))
        return {"total": row["total"], "completed": row["completed"], "failed": row["failed"]}

    def outcomes(self, batch_id: str) -> Iterator[tuple[str, int, Outcome]]:
        """(custom_id, line, outcome) of every finished request, in line order."""
        rows = self._all("SELECT * FROM requests WHERE batch_id = ? AND (status_code IS NOT NULL OR error IS NOT NULL) "
                         "ORDER BY line", (batch_id,))
        for r in rows:
            yield r["custom_id"], r["line"], Outcome(
                r["status_code"], r["request_id"], None if r["response"] is None else json.loads(r["response"]),
                None if r["error"] is None else json.loads(r["error"]))

    # ---- plumbing -----------------------------------------------------------------------------
    def _batch_object(self, row: sqlite3.Row) -> dict[str, Any]:
        batch = dict(row)
        batch.pop("created_seq")
        batch["object"] = "batch"
        batch["errors"] = None if batch["errors"] is None else json.loads(batch["errors"])
        batch["metadata"] = None if batch["metadata"] is None else json.loads(batch["metadata"])
        batch["request_counts"] = self.counts(batch["id"])
        return batch

    def _one(self, sql: str, args: tuple) -> sqlite3.Row | None:
        with self._lock:
            return self._db.execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self) -> "_Transaction":
        return _Transaction(self._db, self._lock)


class _Transaction:
    """One writer at a time, and each write a transaction of its own."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db = db
        self._lock = lock

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        try:
            self._db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self._lock.release()
