"""Batch jobs keep their promise under faults, without a model (a fake route answers): a store
that fails at hypothesis-chosen calls, a hostile input line, an expiry during another batch's
finalize, a result the store refuses, a drain, leftovers of a crash, two processes on one
directory. Every custom_id ends exactly once in the output or error file, and no lock is left held."""
from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.jobs.data_dir_lock import DataDirInUse, DataDirLock
from server.jobs.input_file import MAX_DEPTH, check_requests
from server.jobs.runner import MAX_ATTEMPTS, JobRunner
from server.jobs.store import JobStore, Outcome
from tests.store_faults import FaultyStore
from tests.test_jobs_runner import ENDPOINT, FakeRoute, _line, _output_lines, _run_until, _upload

REPO = Path(__file__).resolve().parents[1]


def _started(store, route, limit: int = 4, **options) -> JobRunner:
    runner = JobRunner(store, route, lambda: limit, **options)
    runner.start()
    return runner


def _answered_ids(store, batch: dict) -> list[str]:
    ok, failed = _output_lines(store, batch["output_file_id"]), _output_lines(store, batch["error_file_id"])
    return sorted(x["custom_id"] for x in ok + failed)


def _store_is_free(store: JobStore) -> bool:
    """No thread holds the store's lock and no transaction is open, in this connection or the file."""
    if store._lock.locked() or store._db.in_transaction:
        return False
    other = sqlite3.connect(store.data_dir / "jobs.sqlite3", timeout=0.5, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fail=st.lists(st.integers(0, 500), max_size=30, unique=True), error=st.sampled_from(["locked", "full", "enospc"]),
       after=st.lists(st.integers(0, 500), max_size=10), outage_at=st.integers(0, 500),
       outage_s=st.sampled_from([0.0, 0.3, 1.5]))
def test_store_faults_at_any_call_lose_no_line_and_leave_no_lock(tmp_path_factory, fail, error, after, outage_at,
                                                                outage_s):
    tmp = tmp_path_factory.mktemp("faults")

    async def main():
        real = JobStore(tmp)
        file_id = _upload(real, [_line(f"c{i}", f"p{i}") for i in range(200)])
        store = FaultyStore(real, {"fail": fail, "error": error, "after": after, "outage": [outage_at, outage_s]})
        runner = _started(store, FakeRoute(), 8)
        batch_id = real.add_batch(ENDPOINT, file_id, 3600, "24h", None)
        batch = await _run_until(runner, real, batch_id, {"completed", "failed"}, timeout=120)
        store.set_plan({})  # the faults end (some planned calls may not have come yet)
        deadline = asyncio.get_running_loop().time() + 10
        while runner.health()["status"] != "running" and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        health = runner.health()
        await runner.stop()
        return real, store, batch, health

    real, store, batch, health = asyncio.run(main())
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 200, "completed": 200, "failed": 0}
    assert _answered_ids(real, batch) == sorted(f"c{i}" for i in range(200))  # each exactly once
    assert health["status"] == "running" and health["reason"] is None
    assert _store_is_free(real)
    assert not [p for p in real.files_dir.iterdir() if p.name.endswith(".part")]


def test_a_failing_begin_or_commit_releases_the_lock_and_rolls_back(tmp_path):
    store = JobStore(tmp_path, busy_timeout_s=0.2)
    file_id = _upload(store, [_line("a")])
    blocker = sqlite3.connect(tmp_path / "jobs.sqlite3", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the database
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        store.add_batch(ENDPOINT, file_id, 3600, "24h", None)
    assert not store._lock.locked() and not store._db.in_transaction
    blocker.execute("ROLLBACK")
    batch_id = store.add_batch(ENDPOINT, file_id, 3600, "24h", None)  # the store works again

    class CommitFails:
        def __init__(self, db):
            self.db = db

        def execute(self, sql, *args):
            if sql == "COMMIT":
                raise sqlite3.OperationalError("database or disk is full")
            return self.db.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.db, name)

    real_db = store._db
    store._db = CommitFails(real_db)
    with pytest.raises(sqlite3.OperationalError, match="full"):
        store.set_status(batch_id, "cancelling")
    assert not store._lock.locked() and not real_db.in_transaction
    store._db = real_db
    assert store.batch(batch_id)["status"] == "validating"  # the failed write was rolled back


def test_a_line_nested_a_thousand_deep_fails_its_batch_and_no_other(tmp_path):
    deep = "[" * 1000 + "]" * 1000
    hostile = json.dumps(_line("deep")).replace('"hi"', deep)
    path = tmp_path / "in.jsonl"
    path.write_text(hostile + "\n" + json.dumps({**_line("shallow"), "body": {"x": json.loads("[" * 200 + "]" * 200)}})
                    + "\n")
    _, problems = check_requests(path, ENDPOINT)
    assert [(p.code, p.line) for p in problems] == [("invalid_json_line", 1), ("invalid_json_line", 2)]
    assert "deep" in problems[0].message and str(MAX_DEPTH) in problems[1].message

    async def main():
        store = JobStore(tmp_path / "data")
        runner = JobRunner(store, FakeRoute(), lambda: 4)
        bad = store.add_batch(ENDPOINT, _upload(store, [hostile]), 3600, "24h", None)
        good = store.add_batch(ENDPOINT, _upload(store, [_line(f"g{i}", f"p{i}") for i in range(20)]), 3600, "24h",
                               None)
        runner.start()
        good_batch = await _run_until(runner, store, good, {"completed"})
        bad_batch = await _run_until(runner, store, bad, {"failed"})
        await runner.stop()
        return store, good_batch, bad_batch

    store, good_batch, bad_batch = asyncio.run(main())
    assert good_batch["request_counts"]["completed"] == 20
    assert bad_batch["errors"]["data"][0]["code"] == "invalid_json_line"


def test_a_line_longer_than_the_limit_is_a_line_error(tmp_path, monkeypatch):
    from server.jobs import input_file

    monkeypatch.setattr(input_file, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(_line("long", "x" * 3000)) + "\n" + json.dumps(_line("short")) + "\n")
    count, problems = check_requests(path, ENDPOINT)
    assert [(p.code, p.line) for p in problems] == [("invalid_json_line", 1)] and "longer" in problems[0].message


def test_an_expiry_while_another_batch_finalizes_ends_expired_not_completed(tmp_path):
    async def main():
        store = JobStore(tmp_path)
        route = FakeRoute(delay=0.3)
        runner = _started(store, route, 4)
        expiring = store.add_batch(ENDPOINT, _upload(store, [_line(f"e{i}") for i in range(6)]), 3600, "24h", None)
        await _run_until(runner, store, expiring, {"in_progress"})
        while not runner.in_flight:
            await asyncio.sleep(0.01)
        store.set_status(expiring, "in_progress", expires_at=int(time.time()) - 1)
        batch = await _run_until(runner, store, expiring, {"expired", "completed"})
        await runner.stop()
        return store, batch

    store, batch = asyncio.run(main())
    assert batch["status"] == "expired"
    counts = batch["request_counts"]
    assert counts["completed"] + counts["failed"] == counts["total"] == 6
    errors = _output_lines(store, batch["error_file_id"])
    assert errors and {x["error"]["code"] for x in errors} == {"batch_expired"}
    assert _answered_ids(store, batch) == sorted(f"e{i}" for i in range(6))


def test_a_result_the_store_keeps_refusing_becomes_an_error_line_with_the_reason(tmp_path):
    class RefusesOneLine(FaultyStore):
        def __getattr__(self, name):
            if name != "record":
                return super().__getattr__(name)

            def record(batch_id, line, outcome):
                if line == 3 and outcome.status_code is not None:
                    raise ValueError("this result cannot be encoded")
                return self._store.record(batch_id, line, outcome)

            return record

    async def main():
        real = JobStore(tmp_path)
        runner = JobRunner(RefusesOneLine(real), FakeRoute(), lambda: 4)
        runner.start()
        batch_id = real.add_batch(ENDPOINT, _upload(real, [_line(f"c{i}", f"p{i}") for i in range(8)]), 3600, "24h",
                                  None)
        batch = await _run_until(runner, real, batch_id, {"completed"})
        await runner.stop()
        return real, batch

    store, batch = asyncio.run(main())
    assert batch["request_counts"] == {"total": 8, "completed": 7, "failed": 1}
    [error] = _output_lines(store, batch["error_file_id"])
    assert error["custom_id"] == "c3" and error["response"] is None
    assert error["error"]["code"] == "result_not_stored" and "cannot be encoded" in error["error"]["message"]
    assert f"after {MAX_ATTEMPTS} attempts" in error["error"]["message"]


def test_a_paused_store_shows_its_reason_and_resumes(tmp_path):
    async def main():
        real = JobStore(tmp_path)
        store = FaultyStore(real)
        runner = _started(store, FakeRoute(delay=0.01), 4)
        batch_id = real.add_batch(ENDPOINT, _upload(real, [_line(f"c{i}", f"p{i}") for i in range(40)]), 3600, "24h",
                                  None)
        await _run_until(runner, real, batch_id, {"in_progress"})
        store.set_plan({"outage": [0, 3600], "error": "full"})  # the disk is full until further notice
        while runner.pause_reason is None:
            await asyncio.sleep(0.01)
        paused = runner.health(), runner.notes(real.batch(batch_id))
        calls = len(runner._execute.calls)
        await asyncio.sleep(1.5)
        calls_while_paused = len(runner._execute.calls) - calls
        store.set_plan({})
        batch = await _run_until(runner, real, batch_id, {"completed"})
        await runner.stop()
        return real, batch, paused, calls_while_paused

    store, batch, (health, notes), calls_while_paused = asyncio.run(main())
    assert health["status"] == "paused" and "database or disk is full" in health["reason"]
    assert notes[0]["code"] == "store_unavailable" and "resume" in notes[0]["message"]
    assert calls_while_paused == 0  # nothing new was sent while results could not be stored
    assert _answered_ids(store, batch) == sorted(f"c{i}" for i in range(40))


def test_a_failing_finalize_is_retried_and_does_not_stop_other_batches(tmp_path):
    class OutputFails(FaultyStore):
        failing = True

        def __getattr__(self, name):
            if name == "outcome_page" and self.failing:
                def page(*args):
                    raise OSError(28, "No space left on device")
                return page
            return super().__getattr__(name)

    async def main():
        real = JobStore(tmp_path)
        store = OutputFails(real)
        runner = _started(store, FakeRoute(), 4)
        first = real.add_batch(ENDPOINT, _upload(real, [_line(f"a{i}") for i in range(5)]), 3600, "24h", None)
        await _run_until(runner, real, first, {"finalizing"})
        await asyncio.sleep(0.2)
        stuck = runner.notes(real.batch(first))
        second = real.add_batch(ENDPOINT, _upload(real, [_line(f"b{i}") for i in range(5)]), 3600, "24h", None)
        while real.counts(second)["completed"] < 5:  # the other batch runs meanwhile
            runner.wake()
            await asyncio.sleep(0.01)
        store.failing = False
        done = await _run_until(runner, real, first, {"completed"}, timeout=20)
        await _run_until(runner, real, second, {"completed"}, timeout=20)
        await runner.stop()
        return real, stuck, done

    store, stuck, done = asyncio.run(main())
    assert stuck[0]["code"] == "finalize_retrying" and "No space left" in stuck[0]["message"]
    assert _answered_ids(store, done) == sorted(f"a{i}" for i in range(5))


def test_a_drain_sends_nothing_more_and_refusals_stay_bounded(tmp_path):
    class Draining(FakeRoute):
        draining = False

        async def __call__(self, url, body, owner="anonymous"):
            outcome = await super().__call__(url, body, owner)
            return None if self.draining else outcome

    async def main():
        store = JobStore(tmp_path)
        route = Draining(delay=0.05)
        runner = _started(store, route, 6)
        batch_id = store.add_batch(ENDPOINT, _upload(store, [_line(f"c{i}", f"p{i}") for i in range(60)]), 3600,
                                   "24h", None)
        while store.counts(batch_id)["completed"] < 6:
            await asyncio.sleep(0.01)
        runner.begin_stop()
        route.draining = True  # the server refuses everything from now on
        calls = len(route.calls)
        await runner.stop()
        return runner, len(route.calls) - calls, store.counts(batch_id)

    runner, calls_after, counts = asyncio.run(main())
    assert calls_after == 0
    assert runner.refused_after_stop <= runner.in_flight_at_stop <= 6
    assert counts["completed"] + runner.refused_after_stop <= 60


def test_nothing_is_sent_while_the_server_does_not_admit(tmp_path):
    async def main():
        store = JobStore(tmp_path)
        route = FakeRoute()
        ready = False
        runner = JobRunner(store, route, lambda: 4, can_submit=lambda: ready)
        runner.start()
        batch_id = store.add_batch(ENDPOINT, _upload(store, [_line(f"c{i}") for i in range(10)]), 3600, "24h", None)
        await _run_until(runner, store, batch_id, {"in_progress"})
        await asyncio.sleep(0.3)
        sent_while_loading = len(route.calls)
        ready = True
        batch = await _run_until(runner, store, batch_id, {"completed"})
        await runner.stop()
        return sent_while_loading, batch

    sent_while_loading, batch = asyncio.run(main())
    assert sent_while_loading == 0 and batch["request_counts"]["completed"] == 10


def test_the_start_sweep_removes_part_files_and_files_no_row_names(tmp_path):
    store = JobStore(tmp_path)
    kept = _upload(store, [_line("a")])
    (store.files_dir / "file-batch_x-output.jsonl.part").write_text("half")
    (store.files_dir / "file_orphan.jsonl").write_text("{}\n")
    deleted = _upload(store, [_line("b")])
    with store._write() as db:  # a delete whose unlink never ran
        db.execute("DELETE FROM files WHERE id = ?", (deleted,))
    removed = store.sweep_files()
    assert sorted(removed) == sorted(["file-batch_x-output.jsonl.part", "file_orphan.jsonl", f"{deleted}.jsonl"])
    assert [p.name for p in store.files_dir.iterdir()] == [f"{kept}.jsonl"]


def test_a_second_holder_of_a_data_directory_is_refused_with_the_first_ones_pid(tmp_path):
    first = DataDirLock(tmp_path)
    with pytest.raises(DataDirInUse, match=f"pid {os.getpid()}"):
        DataDirLock(tmp_path)
    script = "import sys; from server.jobs.data_dir_lock import DataDirLock; DataDirLock(sys.argv[1])"
    other = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert other.returncode != 0 and f"pid {os.getpid()}" in other.stderr
    first.release()
    DataDirLock(tmp_path).release()  # free again once the holder lets go


def test_requests_are_numbered_by_their_place_in_the_file(tmp_path):
    from server.jobs.input_file import read_requests

    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(_line(f"c{i}")) + "\n\n" for i in range(4)))
    requests, _ = read_requests(path, None)
    assert [(r.custom_id, r.index) for r in requests] == [(f"c{i}", i) for i in range(4)]
