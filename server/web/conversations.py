"""The web page's conversations, kept on the server: one SQLite database in the data directory,
beside the batch jobs' (DATA_DIR/conversations.sqlite3).

A conversation is a title, its messages and the playground settings it was held with, stored
whole as JSON: the page reads and writes it whole, so there is nothing to join. Every row names
its owner (server/auth.py's owner id), and a lookup given an owner sees only that owner's rows,
as the job store does. Calls block on the disk: the routes make them on a store thread.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from server.jobs.store import ANONYMOUS, new_id

FILE_NAME = "conversations.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, messages TEXT NOT NULL, settings TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS conversations_recent ON conversations (owner, updated_at);
"""


class ConversationStore:
    def __init__(self, data_dir: str | Path) -> None:
        path = Path(data_dir).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path / FILE_NAME, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")  # a committed turn survives the process being killed
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create(self, title: str, messages: list[dict[str, Any]], settings: dict[str, Any], *,
               owner: str = ANONYMOUS) -> dict[str, Any]:
        conversation_id = new_id("conv")
        now = time.time()
        with self._lock:
            self._db.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (conversation_id, owner, title, now, now, json.dumps(messages), json.dumps(settings)))
        found = self.get(conversation_id)
        assert found is not None
        return found

    def get(self, conversation_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM conversations WHERE id = ? AND (? IS NULL OR owner = ?)",
                                   (conversation_id, owner, owner)).fetchone()
        return None if row is None else _whole(row)

    def list(self, *, owner: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The most recently updated first, without their messages (a count instead)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, title, created_at, updated_at, json_array_length(messages) AS n FROM conversations "
                "WHERE (? IS NULL OR owner = ?) ORDER BY updated_at DESC, id LIMIT ?", (owner, owner, limit)).fetchall()
        return [{"id": r["id"], "object": "conversation", "title": r["title"], "created_at": r["created_at"],
                 "updated_at": r["updated_at"], "message_count": r["n"]} for r in rows]

    def update(self, conversation_id: str, changes: dict[str, Any], *,
               owner: str | None = None) -> dict[str, Any] | None:
        """Replace the fields given (title, messages, settings); None if there is no such conversation."""
        columns = {k: (v if k == "title" else json.dumps(v)) for k, v in changes.items()}
        assert set(columns) <= {"title", "messages", "settings"}
        sets = "".join(f", {k} = ?" for k in columns)
        with self._lock:
            changed = self._db.execute(
                f"UPDATE conversations SET updated_at = ?{sets} WHERE id = ? AND (? IS NULL OR owner = ?)",
                (time.time(), *columns.values(), conversation_id, owner, owner)).rowcount
        return self.get(conversation_id) if changed else None

    def delete(self, conversation_id: str, *, owner: str | None = None) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM conversations WHERE id = ? AND (? IS NULL OR owner = ?)",
                                    (conversation_id, owner, owner)).rowcount > 0


def _whole(row: sqlite3.Row) -> dict[str, Any]:
    return {"id": row["id"], "object": "conversation", "title": row["title"], "created_at": row["created_at"],
            "updated_at": row["updated_at"], "messages": json.loads(row["messages"]),
            "settings": json.loads(row["settings"])}
