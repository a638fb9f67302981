"""Batch jobs against a real `cobatch serve`, driven by the official openai client: a job runs
to completion, survives SIGKILL mid-job without losing or repeating a request, and malformed
inputs get OpenAI's answers while the server stays healthy."""
from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from server.jobs.store import JobStore
from tests.server_fixtures import serve_process, wait_until

pytestmark = [pytest.mark.model, pytest.mark.slow]

ENDPOINT = "/v1/chat/completions"


@contextlib.contextmanager
def serving(data_dir: Path, *extra: str):
    with serve_process("--n-ctx", "2048", "--max-running", "8", "--step-token-budget", "128", "--data-dir", str(data_dir),
                       *extra) as (proc, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        yield proc, url, client, client.models.list().data[0].id


def _jsonl(model: str, n: int, max_tokens: int = 6) -> bytes:
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": ENDPOINT,
              "body": {"model": model, "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Say the number {i}."}]}} for i in range(n)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _wait_for(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 300):
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def _finished_chat_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(r'^cobatch_requests_total\{[^}]*endpoint="chat_completions"'
                                                      r'[^}]*\} (\S+)$', text, re.M))


def test_a_job_submitted_with_the_openai_client_completes(tmp_path):
    with serving(tmp_path) as (proc, url, client, model):
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(model, 12))), purpose="batch")
        assert uploaded.purpose == "batch" and uploaded.bytes > 0
        assert client.files.retrieve(uploaded.id).filename == "in.jsonl"
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h",
                                      metadata={"run": "test"})
        assert batch.status == "validating" and batch.metadata == {"run": "test"}
        batch = _wait_for(client, batch.id, {"completed", "failed"})
        assert batch.status == "completed", batch.errors
        assert batch.request_counts.total == batch.request_counts.completed == 12
        out = _lines(client, batch.output_file_id)
        assert sorted(x["custom_id"] for x in out) == sorted(f"q{i}" for i in range(12))
        for x in out:
            body = x["response"]["body"]
            assert x["response"]["status_code"] == 200 and body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["content"] and x["error"] is None
        listed = client.batches.list(limit=5)
        assert [b.id for b in listed.data] == [batch.id]
        assert {f.id for f in client.files.list(purpose="batch_output")} == {batch.output_file_id}
        assert uploaded.id in {f.id for f in client.files.list()}
        assert client.files.delete(uploaded.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(uploaded.id)


def test_sigkill_mid_job_then_restart_runs_each_request_exactly_once(tmp_path):
    n = 40
    with serving(tmp_path) as (proc, url, client, model):
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(model, n, max_tokens=16))),
                                       purpose="batch")
        batch_id = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h").id
        wait_until(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 5, 300, "no progress")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    store = JobStore(tmp_path)
    done_before = store.counts(batch_id)["completed"]
    store.close()
    assert 5 <= done_before < n
    with serving(tmp_path) as (proc, url, client, model):
        batch = _wait_for(client, batch_id, {"completed"})
        out = _lines(client, batch.output_file_id)
        assert sorted(x["custom_id"] for x in out) == sorted(f"q{i}" for i in range(n))  # each exactly once
        assert batch.request_counts.completed == n
        assert _finished_chat_requests(url) == n - done_before  # finished ones were not computed again


def test_sigterm_mid_job_then_restart_finishes_it(tmp_path):
    with serving(tmp_path, "--drain-timeout", "2") as (proc, url, client, model):
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(model, 30, max_tokens=16))),
                                       purpose="batch")
        batch_id = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h").id
        wait_until(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 3, 300, "no progress")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    with serving(tmp_path) as (proc, url, client, model):
        batch = _wait_for(client, batch_id, {"completed"})
        out = _lines(client, batch.output_file_id)
        assert sorted(x["custom_id"] for x in out) == sorted(f"q{i}" for i in range(30))


def test_malformed_batch_inputs_get_openai_answers_and_the_server_stays_healthy(tmp_path):
    with serving(tmp_path, "--max-upload-bytes", "4096") as (proc, url, client, model):
        def upload(data: bytes):
            return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id

        def create(file_id: str, **extra):
            return client.batches.create(input_file_id=file_id, endpoint=extra.pop("endpoint", ENDPOINT),
                                         completion_window=extra.pop("completion_window", "24h"), **extra)

        good = _jsonl(model, 1)
        line = json.loads(good)
        cases = {
            "bad json": b"{not json\n" + good,
            "wrong url": json.dumps({**line, "url": "/v1/embeddings"}).encode() + b"\n",
            "duplicate custom_id": good + good,
            "empty file": b"",
            "wrong method": json.dumps({**line, "method": "GET"}).encode() + b"\n",
        }
        for name, data in cases.items():
            batch = _wait_for(client, create(upload(data)).id, {"failed", "completed"})
            assert batch.status == "failed" and batch.errors.data, name
        # A body the route refuses is an error line with the route's own 400, not a failed batch.
        refused = json.dumps({**line, "body": {**line["body"], "max_tokens": -1}}).encode() + b"\n"
        batch = _wait_for(client, create(upload(good.replace(b'"q0"', b'"ok"') + refused)).id, {"completed"})
        errors = _lines(client, batch.error_file_id)
        assert [e["response"]["status_code"] for e in errors] == [400] and errors[0]["custom_id"] == "q0"
        assert batch.request_counts.completed == 1 and batch.request_counts.failed == 1
        with pytest.raises(openai.APIStatusError) as info:  # over the configured upload limit
            upload(b"x" * 5000)
        assert info.value.status_code == 413
        with pytest.raises(openai.NotFoundError):
            create("file-nope")
        with pytest.raises(openai.BadRequestError):
            create(upload(good), endpoint="/v1/embeddings")
        with pytest.raises(openai.BadRequestError):
            create(upload(good), completion_window="1h")
        with pytest.raises(openai.BadRequestError):  # cancelling a finished job
            client.batches.cancel(batch.id)
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_nope")
        with pytest.raises(openai.BadRequestError):
            client.files.create(file=("in.jsonl", io.BytesIO(good)), purpose="fine-tune")
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        reply = client.chat.completions.create(model=model, max_tokens=4,
                                               messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content is not None


def test_cancel_stops_a_running_job_and_keeps_what_finished(tmp_path):
    with serving(tmp_path) as (proc, url, client, model):
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(model, 60, max_tokens=24))),
                                       purpose="batch")
        batch_id = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h").id
        wait_until(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 2, 300, "no progress")
        assert client.batches.cancel(batch_id).status in ("cancelling", "cancelled")
        batch = _wait_for(client, batch_id, {"cancelled"}, timeout=60)
        counts = batch.request_counts
        assert counts.completed >= 2 and counts.completed + counts.failed == counts.total == 60
        ids = [x["custom_id"] for x in _lines(client, batch.output_file_id) + _lines(client, batch.error_file_id)]
        assert sorted(ids) == sorted(f"q{i}" for i in range(60))
        wait_until(lambda: httpx.get(f"{url}/health", timeout=5).json()["running"] == 0, 30,
                   "the cancelled job's requests are still running")
