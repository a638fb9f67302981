"""A JobStore that fails on purpose, for fault-injection tests, and `cobatch serve` running on one.

    python -m tests.store_faults PLAN.json serve --data-dir D ...

runs the real `cobatch serve` whose job store is a FaultyStore reading PLAN.json (re-read whenever
the file changes, counting calls from then on):

    {"fail": [3, 17, 18], "error": "full", "after": [17], "outage": [40, 1.5], "delay": {"outcome_page": 0.5}}

makes the store's calls number 3, 17 and 18 (from 0, any public method but file_path, close and
sweep_files) raise: "locked" and "full" are sqlite3.OperationalError ("database is locked",
"database or disk is full"), "enospc" is OSError(ENOSPC). A call listed in "after" fails once it
has done its work (the caller cannot tell whether it did); the others fail before. "outage" makes
every call fail for 1.5 s from call 40 on (a disk full for a while). "delay" slows every call of a
method by that many seconds (to stretch a finalize, say). Past those the store works again.
"""
from __future__ import annotations

import errno
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from server.jobs.store import JobStore

UNCOUNTED = frozenset({"file_path", "close", "sweep_files", "data_dir", "files_dir"})


def make_error(kind: str) -> BaseException:
    if kind == "locked":
        return sqlite3.OperationalError("database is locked")
    if kind == "full":
        return sqlite3.OperationalError("database or disk is full")
    if kind == "enospc":
        return OSError(errno.ENOSPC, "No space left on device")
    raise ValueError(f"unknown error kind {kind!r}")


class FaultyStore:
    def __init__(self, store: JobStore, plan: dict[str, Any] | None = None, plan_file: Path | None = None) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._plan_file = plan_file
        self._plan_stamp: tuple[int, int] | None = None
        self.calls = 0
        self.raised = 0
        self.set_plan(plan or {})

    def set_plan(self, plan: dict[str, Any]) -> None:
        with self._lock:
            self._fail = set(plan.get("fail", ()))
            self._after = set(plan.get("after", ()))
            self._error = plan.get("error", "locked")
            self._delay = dict(plan.get("delay", {}))
            self._outage_at, self._outage_s = plan.get("outage") or (None, 0.0)
            self._outage_until: float | None = None
            self.calls = 0

    def _in_outage(self, index: int) -> bool:
        if self._outage_at is None or index < self._outage_at:
            return False
        if self._outage_until is None:
            self._outage_until = time.monotonic() + self._outage_s
        return time.monotonic() < self._outage_until

    def _reload(self) -> None:
        if self._plan_file is None:
            return
        try:
            st = self._plan_file.stat()
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._plan_stamp:
            self._plan_stamp = stamp
            self.set_plan(json.loads(self._plan_file.read_text()))

    def _count_raised(self) -> None:
        with self._lock:
            self.raised += 1
            raised = self.raised
        if self._plan_file is not None:
            self._plan_file.with_name(self._plan_file.name + ".raised").write_text(str(raised))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name in UNCOUNTED or name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._reload()
            with self._lock:
                index = self.calls
                self.calls += 1
                fails = index in self._fail or self._in_outage(index)
                after, error, delay = index in self._after, self._error, self._delay
            if delay.get(name):
                time.sleep(delay[name])
            if fails and not after:
                self._count_raised()
                raise make_error(error)
            result = attr(*args, **kwargs)
            if fails:
                self._count_raised()
                raise make_error(error)
            return result

        return call


def main(argv: list[str]) -> int:
    from server import cli
    from server.jobs import routes

    plan_file = Path(argv[0])
    real = routes.JobStore
    routes.JobStore = lambda data_dir: FaultyStore(real(data_dir), plan_file=plan_file)
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
