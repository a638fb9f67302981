"""Batch jobs against a real `cobatch serve` under faults: a job store that fails at
hypothesis-chosen calls, SIGKILL at random moments (finalize included) with restarts, a hostile
line, a second server on the same data directory, two keys that cannot see each other's files,
and a drain while a job runs. Each time every custom_id is answered exactly once."""
from __future__ import annotations

import io
import json
import random
import re
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_fixtures import serve_process, spawn_serve, wait_serving, wait_until

pytestmark = pytest.mark.model

ENDPOINT = "/v1/chat/completions"
SERVE_ARGS = ("--n-ctx", "2048", "--max-running", "8", "--step-token-budget", "128")
FAULTY = ("-m", "tests.store_faults")


def _jsonl(model: str, n: int, max_tokens: int = 2, prefix: str = "q") -> bytes:
    lines = [{"custom_id": f"{prefix}{i}", "method": "POST", "url": ENDPOINT,
              "body": {"model": model, "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Say {i}."}]}} for i in range(n)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _get(client: httpx.Client, path: str) -> httpx.Response:
    """GET, tolerating the 500s a failing store may give while faults last."""
    deadline = time.monotonic() + 60
    while (r := client.get(path)).status_code >= 500:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    return r


def _submit(client: httpx.Client, data: bytes) -> str:
    deadline = time.monotonic() + 60
    while True:  # the store may refuse the upload or the batch while faults last: try again, as a client would
        answer = client.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
        if answer.status_code == 200:
            answer = client.post("/v1/batches", json={"input_file_id": answer.json()["id"], "endpoint": ENDPOINT,
                                                      "completion_window": "24h"})
            if answer.status_code == 200:
                return answer.json()["id"]
        assert answer.status_code >= 500 and time.monotonic() < deadline, answer.text
        time.sleep(0.1)


def _ended(client: httpx.Client, batch_id: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while (batch := _get(client, f"/v1/batches/{batch_id}").json())["status"] not in (
            "completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


def _answered(client: httpx.Client, batch: dict) -> list[str]:
    ids = []
    for key in ("output_file_id", "error_file_id"):
        if batch[key]:
            text = _get(client, f"/v1/files/{batch[key]}/content").text
            ids += [json.loads(x)["custom_id"] for x in text.splitlines()]
    return sorted(ids)


def _no_write_lock(data_dir: Path) -> bool:
    """Another connection can take the database's write lock at once: the server holds no transaction open."""
    db = sqlite3.connect(data_dir / "jobs.sqlite3", timeout=2, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return True
    finally:
        db.close()


def _model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


# ---- a store that fails -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("faulty")
    plan = data_dir.parent / "plan.json"
    plan.write_text("{}")
    with serve_process(*SERVE_ARGS, "--data-dir", str(data_dir), launcher=(*FAULTY, str(plan))) as (proc, url):
        yield data_dir, plan, url


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fail=st.lists(st.integers(0, 600), min_size=1, max_size=25, unique=True),
       error=st.sampled_from(["locked", "full", "enospc"]), after=st.lists(st.integers(0, 600), max_size=8),
       outage_at=st.integers(0, 600), outage_s=st.sampled_from([0.5, 2.0]))
def test_store_faults_during_a_200_line_job_lose_no_line(faulty_server, fail, error, after, outage_at, outage_s):
    data_dir, plan, url = faulty_server
    model = _model(url)
    raised = plan.with_name(plan.name + ".raised")
    before = int(raised.read_text()) if raised.exists() else 0
    plan.write_text(json.dumps({"fail": fail, "error": error, "after": after, "outage": [outage_at, outage_s]}))
    with httpx.Client(base_url=url, timeout=60) as client:
        batch_id = _submit(client, _jsonl(model, 200))
        batch = _ended(client, batch_id)
        assert batch["status"] == "completed", batch
        assert batch["request_counts"] == {"total": 200, "completed": 200, "failed": 0}
        assert _answered(client, batch) == sorted(f"q{i}" for i in range(200))  # each exactly once
        plan.write_text("{}")  # the faults end (some planned calls may not have come yet): the jobs resume
        wait_until(lambda: client.get("/health").json()["jobs"]["status"] == "running", 30, "jobs still paused")
        assert client.get("/health").status_code == 200
        reply = client.post("/v1/chat/completions", json={"model": model, "max_tokens": 2,
                                                          "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200
    assert _no_write_lock(data_dir)
    assert int(raised.read_text()) > before  # the store did fail during this job


# ---- SIGKILL at random moments ------------------------------------------------------------------
def _kill_and_restart(tmp_path: Path, kills: int, during_finalize: int, seed: int) -> None:
    """Run one 120-line job through `kills` SIGKILLs at random moments, the last `during_finalize`
    of them while the batch is finalizing (stretched by a slow store read), restarting each time."""
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"delay": {"outcome_page": 1.0}}))  # finalizing takes a second or more
    batch_id = None
    landed = {"running": 0, "finalizing": 0, "other": 0}
    for k in range(kills + 1):
        proc, url = spawn_serve(*SERVE_ARGS, "--data-dir", str(data_dir), launcher=(*FAULTY, str(plan)))
        try:
            wait_serving(proc, url)
            with httpx.Client(base_url=url, timeout=60) as client:
                if batch_id is None:
                    batch_id = _submit(client, _jsonl(_model(url), 120, max_tokens=8))
                if k == kills:  # the last run: let it finish
                    batch = _ended(client, batch_id)
                    assert batch["status"] == "completed", batch
                    assert batch["request_counts"] == {"total": 120, "completed": 120, "failed": 0}
                    assert _answered(client, batch) == sorted(f"q{i}" for i in range(120))
                    break
                if k >= kills - during_finalize:
                    wait_until(lambda: client.get(f"/v1/batches/{batch_id}").json()["status"]
                               in ("finalizing", "completed"), 300, "the batch did not reach finalizing")
                    time.sleep(rng.uniform(0.0, 0.8))
                else:
                    time.sleep(rng.uniform(0.2, 3.0))
                status = client.get(f"/v1/batches/{batch_id}").json()["status"]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        landed[status if status in landed else "other"] += 1
    assert landed["finalizing"] >= min(1, during_finalize), landed


def test_sigkill_at_random_moments_then_restart_answers_each_line_once(tmp_path):
    _kill_and_restart(tmp_path, kills=3, during_finalize=1, seed=46)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # twenty model loads
def test_twenty_sigkills_at_random_moments_then_restart_answer_each_line_once(tmp_path):
    _kill_and_restart(tmp_path, kills=20, during_finalize=5, seed=4646)


# ---- keys, a hostile line, one server per data directory ---------------------------------------
@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("keyed")
    with serve_process(*SERVE_ARGS, "--data-dir", str(data_dir), "--api-key", "sk-alice", "--api-key", "sk-bob",
                       "--admin-api-key", "sk-admin") as (proc, url):
        yield proc, url, data_dir


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def test_two_keys_cannot_see_each_others_files_or_batches(keyed_server):
    proc, url, _ = keyed_server
    alice, bob, admin = _client(url, "sk-alice"), _client(url, "sk-bob"), _client(url, "sk-admin")
    model = alice.models.list().data[0].id
    uploaded = alice.files.create(file=("a.jsonl", io.BytesIO(_jsonl(model, 2))), purpose="batch")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")
    bobs = bob.files.create(file=("b.jsonl", io.BytesIO(_jsonl(model, 1))), purpose="batch")
    assert uploaded.id not in {f.id for f in bob.files.list()} and bobs.id in {f.id for f in bob.files.list()}
    assert batch.id not in {b.id for b in bob.batches.list()}
    for call in (lambda: bob.files.retrieve(uploaded.id), lambda: bob.files.content(uploaded.id),
                 lambda: bob.files.delete(uploaded.id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.batches.cancel(batch.id),
                 lambda: bob.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    done = alice.batches.retrieve(batch.id)
    deadline = time.monotonic() + 120
    while done.status != "completed":
        assert time.monotonic() < deadline, done
        time.sleep(0.2)
        done = alice.batches.retrieve(batch.id)
    assert {done.output_file_id, uploaded.id} <= {f.id for f in alice.files.list()}
    assert done.output_file_id not in {f.id for f in bob.files.list()}
    with pytest.raises(openai.NotFoundError):
        bob.files.content(done.output_file_id)
    assert {uploaded.id, bobs.id, done.output_file_id} <= {f.id for f in admin.files.list()}
    assert admin.batches.retrieve(batch.id).status == "completed"
    assert alice.files.retrieve(uploaded.id).id == uploaded.id  # nothing bob tried touched it


def test_a_line_a_thousand_deep_fails_its_batch_while_a_good_one_completes(keyed_server):
    proc, url, _ = keyed_server
    alice = _client(url, "sk-alice")
    model = alice.models.list().data[0].id
    hostile = json.dumps({"custom_id": "deep", "method": "POST", "url": ENDPOINT,
                          "body": {"model": model, "messages": "@"}}).replace('"@"', "[" * 1000 + "]" * 1000)
    bad = alice.files.create(file=("bad.jsonl", io.BytesIO(hostile.encode() + b"\n")), purpose="batch")
    good = alice.files.create(file=("good.jsonl", io.BytesIO(_jsonl(model, 20))), purpose="batch")
    bad_batch = alice.batches.create(input_file_id=bad.id, endpoint=ENDPOINT, completion_window="24h")
    good_batch = alice.batches.create(input_file_id=good.id, endpoint=ENDPOINT, completion_window="24h")
    deadline = time.monotonic() + 180
    while (g := alice.batches.retrieve(good_batch.id)).status != "completed":
        assert time.monotonic() < deadline and g.status not in ("failed", "cancelled"), g
        time.sleep(0.2)
    assert g.request_counts.completed == 20
    b = alice.batches.retrieve(bad_batch.id)
    assert b.status == "failed" and b.errors.data[0].code == "invalid_json_line" and b.errors.data[0].line == 1
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_a_second_server_on_the_same_data_directory_exits_at_once_naming_the_first(keyed_server, tmp_path):
    proc, url, data_dir = keyed_server
    started = time.monotonic()
    second, _ = spawn_serve(*SERVE_ARGS, "--data-dir", str(data_dir), log=tmp_path / "second.log")
    assert second.wait(60) != 0
    assert time.monotonic() - started < 30  # before loading a model
    said = (tmp_path / "second.log").read_text()
    assert f"pid {proc.pid}" in said and "in use" in said, said
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # the first one is untouched


# ---- drain ----------------------------------------------------------------------------------
def test_a_drain_with_a_running_job_refuses_at_most_the_requests_in_flight(tmp_path):
    log = tmp_path / "serve.log"
    data_dir = tmp_path / "data"
    proc, url = spawn_serve(*SERVE_ARGS, "--data-dir", str(data_dir), "--drain-timeout", "1", "--log-level", "info",
                            log=log)
    try:
        wait_serving(proc, url)
        with httpx.Client(base_url=url, timeout=60) as client:
            batch_id = _submit(client, _jsonl(_model(url), 48, max_tokens=16))
            wait_until(lambda: client.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"] >= 8, 300,
                       "no progress")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    said = log.read_text()
    found = re.search(r"batch jobs stopped: (\d+) request\(s\) were in flight when the drain began; (\d+) answered "
                      r"'not now'", said)
    assert found, said[-2000:]
    in_flight, refused = int(found.group(1)), int(found.group(2))
    assert 0 < in_flight <= 10 and refused <= in_flight  # 10: in_flight_for(8), the runner's bound
    with serve_process(*SERVE_ARGS, "--data-dir", str(data_dir)) as (proc, url):
        with httpx.Client(base_url=url, timeout=60) as client:
            batch = _ended(client, batch_id)
            assert batch["status"] == "completed" and _answered(client, batch) == sorted(f"q{i}" for i in range(48))
