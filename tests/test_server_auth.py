"""API keys: every route but /health (and /metrics unless protected) needs a valid bearer key;
a refusal is OpenAI's 401, keys are compared in constant time and never logged."""
from __future__ import annotations

import io
import json
import logging
import time

import httpx
import openai
import pytest

from server.auth import KeyCheck, owner_for_key, read_keys
from tests.server_fixtures import running_server, shared_engine

KEYS = ("sk-first-key", "sk-second-key")


def test_keys_come_from_flags_a_file_and_the_environment(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nsk-file-1\n\nsk-file-2  # rotated in May\n")
    keys = read_keys(["sk-flag"], key_file, {"COBATCH_API_KEY": "sk-env-1, sk-env-2,sk-flag"})
    assert keys == ("sk-flag", "sk-file-1", "sk-file-2", "sk-env-1", "sk-env-2")
    with pytest.raises(ValueError):
        read_keys(["has space"], None, {})
    assert read_keys([], None, {}) == ()


def test_only_a_configured_key_as_a_bearer_token_passes_and_names_its_caller():
    check = KeyCheck(KEYS, admin_keys=["sk-admin"])
    first, second = check.identify("Bearer sk-first-key"), check.identify("bearer sk-second-key")
    assert first.owner == owner_for_key("sk-first-key") != second.owner == owner_for_key("sk-second-key")
    assert not first.sees_all and first.scope == first.owner
    assert "sk-first-key" not in first.owner and owner_for_key("sk-first-key") == first.owner  # stable, not the key
    assert check.identify("Bearer sk-admin").sees_all and check.identify("Bearer sk-admin").scope is None
    assert check.identify(f"Bearer {check.internal_key}").sees_all
    for header in (None, "", "Bearer", "Bearer ", "Basic sk-first-key", "Bearer sk-first-keyX", "sk-first-key"):
        assert check.identify(header) is None, header


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    engine = shared_engine()
    with running_server(lambda: engine, engine, api_keys=KEYS, data_dir=tmp_path_factory.mktemp("jobs")) as server:
        yield server


@pytest.mark.model
def test_requests_need_a_valid_key_and_open_routes_stay_open(guarded, caplog):
    caplog.set_level(logging.DEBUG)
    http = httpx.Client(base_url=guarded.url, timeout=60)
    url = guarded.url
    assert http.get("/health").status_code == 200
    assert http.get("/metrics").status_code == 200
    for headers in ({}, {"Authorization": "Bearer sk-wrong-key"}):
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 2}, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"] == "invalid_request_error"
        assert http.get("/v1/models", headers=headers).status_code == 401
    r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 2}, headers={"Authorization": "Bearer sk-second-key"})
    assert r.status_code == 200 and r.json()["text"] is not None
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="x", prompt="Hi", max_tokens=2)
    right = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-first-key", max_retries=0)
    model = right.models.list().data[0].id
    assert right.completions.create(model=model, prompt="Hi", max_tokens=2).choices[0].text is not None
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert not any(secret in logged for secret in (*KEYS, "sk-wrong-key"))


@pytest.mark.model
def test_batch_jobs_run_under_keys(guarded):
    client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="sk-first-key", max_retries=0)
    model = client.models.list().data[0].id
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
            "body": {"model": model, "prompt": "One, two,", "max_tokens": 3}}
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO((json.dumps(line) + "\n").encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline and batch.status not in ("failed", "cancelled"), batch
        time.sleep(0.1)
    assert batch.request_counts.completed == 1  # the job's own calls carry the server's internal key


@pytest.mark.model
def test_metrics_can_be_protected_too():
    engine = shared_engine()
    with running_server(lambda: engine, engine, api_keys=KEYS, protect_metrics=True) as server:
        http = httpx.Client(base_url=server.url, timeout=60)
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers={"Authorization": "Bearer sk-first-key"}).status_code == 200
        assert http.get("/health").status_code == 200
