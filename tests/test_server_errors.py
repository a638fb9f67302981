"""Every error class: the status, a message saying what is wrong, and that nothing changed.

The engine here runs one sequence and queues one more (max_running=1, max_waiting=1) so a full
queue is easy to reach for the 429 test.
"""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from starlette.requests import ClientDisconnect
from starlette.requests import Request as StarletteRequest

from bench.sse import sse_events
from engine import FinishReason, GenerationResult, RequestMetrics
from server.app import _api
from server.metrics import ServerMetrics
from tests.server_fixtures import (
    assert_engine_idle,
    make_engine,
    metric,
    raw_http_request,
    running_server,
    scrape,
    wait_until,
)

pytestmark = pytest.mark.model

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def live():
    with make_engine(n_ctx=2048, max_running=1, step_token_budget=128, max_waiting=1) as engine:
        with running_server(lambda: engine, engine, max_body_bytes=MAX_BODY) as server:
            yield server


@pytest.fixture
def client(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


class Unchanged:
    """Records engine steps and finished-request counters; `check()` asserts nothing ran."""

    def __init__(self, live, client):
        self.live, self.client = live, client
        self.steps = live.engine.stats().steps
        self.finished = metric(scrape(client), "cobatch_requests_total")

    def check(self):
        assert_engine_idle(self.live.engine)
        assert self.live.engine.stats().steps == self.steps, "the engine did work for a refused request"
        assert metric(scrape(self.client), "cobatch_requests_total") == self.finished


def assert_error(response: httpx.Response, status: int, *fragments: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in error["message"], (fragment, error["message"])
    return error


GOOD = {"prompt": "Hello", "max_tokens": 4}

BAD_BODIES = [
    ('{"prompt": ', "not valid JSON"),
    ('{"prompt": "x", "temperature": NaN}', "NaN is not a JSON value"),
    ("[1, 2]", "must be a JSON object, got an array"),
    ("", "request body is empty"),
    ('"just a string"', "must be a JSON object, got a string"),
]

BAD_FIELDS = [
    ({"max_tokens": 4}, "'prompt' is required", "prompt"),
    ({"prompt": 42}, "'prompt' must be a string, got a number", "prompt"),
    ({"prompt": []}, "'prompt' must not be an empty list", "prompt"),
    ({"prompt": ["a", 3]}, "'prompt[1]' must be a string, got a number", "prompt[1]"),
    ({"prompt": ""}, "'prompt' must not be empty", "prompt"),
    ({"prompt": "   \n"}, "'prompt' must not be empty", "prompt"),
    ({**GOOD, "tempreature": 0.1}, "unknown field(s): 'tempreature'", "tempreature"),
    ({**GOOD, "max_tokens": 0}, "'max_tokens' must be >= 1, got 0", "max_tokens"),
    ({**GOOD, "max_tokens": 10**9}, "'max_tokens' must be <= 2048", "max_tokens"),
    ({**GOOD, "max_tokens": "8"}, "'max_tokens' must be an integer, got a string", "max_tokens"),
    ({**GOOD, "max_tokens": 2.5}, "'max_tokens' must be an integer, got a number", "max_tokens"),
    ({**GOOD, "temperature": -0.1}, "'temperature' must be >= 0.0", "temperature"),
    ({**GOOD, "temperature": "hot"}, "'temperature' must be a number, got a string", "temperature"),
    ({**GOOD, "top_p": 0}, "'top_p' must be greater than 0.0", "top_p"),
    ({**GOOD, "top_p": 1.5}, "'top_p' must be <= 1.0", "top_p"),
    ({**GOOD, "top_k": -1}, "'top_k' must be >= 0", "top_k"),
    ({**GOOD, "seed": -5}, "'seed' must be >= 0", "seed"),
    ({**GOOD, "seed": True}, "'seed' must be an integer, got a boolean", "seed"),
    ({**GOOD, "stop": [""]}, "'stop[0]' must not be empty", "stop"),
    ({**GOOD, "stop": 7}, "'stop' must be a string or a list of strings", "stop"),
    ({**GOOD, "stop": ["x"] * 17}, "'stop' may hold at most 16 strings", "stop"),
    ({**GOOD, "priority": "urgent"}, "'priority' must be one of 'interactive', 'batch', got 'urgent'", "priority"),
    ({**GOOD, "format": "xml"}, "'format' must be one of 'raw', 'json'", "format"),
    ({**GOOD, "stream": "yes"}, "'stream' must be true or false", "stream"),
    ({**GOOD, "format": "raw", "json_schema": {"type": "object"}}, "drop \"format\": \"raw\"", "format"),
    ({**GOOD, "json_schema": {"type": "objekt"}}, "is not a valid JSON Schema", "json_schema"),
    ({**GOOD, "format": "json", "json_schema": {"type": "objekt"}}, "is not a valid JSON Schema", "json_schema"),
    ({**GOOD, "format": "json", "json_schema": [1]}, "must be a JSON Schema object", "json_schema"),
    ({**GOOD, "format": "json", "stop": "}"}, "'stop' cannot be combined with JSON output", "stop"),
    ({**GOOD, "logprobs": 2, "stream": True}, "'logprobs' is not supported with \"stream\": true", "logprobs"),
    ({**GOOD, "logprobs": 21}, "'logprobs' must be <= 20", "logprobs"),
    ({**GOOD, "logit_bias": {"x": 1}}, "keys must be non-negative integer token ids", "logit_bias"),
    ({**GOOD, "logit_bias": {"5": -101}}, "must be between -100 and 100", "logit_bias"),
    ({**GOOD, "presence_penalty": 3}, "'presence_penalty' must be <= 2.0", "presence_penalty"),
    ({**GOOD, "repetition_penalty": -1}, "'repetition_penalty' must be greater than 0.0", "repetition_penalty"),
    ({**GOOD, "min_p": -0.1}, "'min_p' must be >= 0.0", "min_p"),
]


@pytest.mark.parametrize("raw, fragment", BAD_BODIES)
def test_malformed_bodies_are_400(client, live, raw, fragment):
    unchanged = Unchanged(live, client)
    response = client.post("/generate", content=raw, headers={"content-type": "application/json"})
    assert_error(response, 400, fragment)
    unchanged.check()


@pytest.mark.parametrize("body, fragment, param", BAD_FIELDS)
def test_invalid_fields_are_400_naming_the_field(client, live, body, fragment, param):
    unchanged = Unchanged(live, client)
    error = assert_error(client.post("/generate", json=body), 400, fragment)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    unchanged.check()


def test_over_long_prompt_is_400_with_the_token_counts(client, live):
    unchanged = Unchanged(live, client)
    error = assert_error(client.post("/generate", json={"prompt": "word " * 3000, "max_tokens": 4}), 400,
                         "prompt has", "tokens but the context holds")
    assert error["code"] == "context_length_exceeded"
    unchanged.check()


def test_body_over_the_size_limit_is_413(client, live):
    unchanged = Unchanged(live, client)
    assert_error(client.post("/generate", json={"prompt": "a" * (MAX_BODY + 10)}), 413, "limit")
    unchanged.check()


@pytest.mark.parametrize(
    "extra, fragment, param",
    [
        ({"format": "json", "json_schema": {"type": "object", "propertyNames": {"maxLength": 2}}},
         "unsupported keyword 'propertyNames'", "json_schema"),
        ({"format": "json", "json_schema": {"type": "object", "properties": {"a": {"type": "string"}},
                                            "required": ["a"]}, "max_tokens": 1}, "max_tokens=1", "max_tokens"),
        ({"logit_bias": {"10000000": 1}}, "outside the vocabulary", "logit_bias"),
    ],
)
def test_requests_the_engine_refuses_at_submit_are_400(client, live, extra, fragment, param):
    unchanged = Unchanged(live, client)
    error = assert_error(client.post("/generate", json={**GOOD, **extra}), 400, fragment)
    assert error["param"] == param
    unchanged.check()


def test_unknown_route_and_wrong_method_are_json_errors(client, live):
    assert_error(client.get("/nope"), 404, "no route for /nope")
    response = client.get("/generate")
    assert_error(response, 405, "GET is not allowed")
    assert "POST" in response.headers["allow"]


def test_rejections_are_counted_by_reason(client, live):
    before = scrape(client)
    client.post("/generate", json={"prompt": ""})
    after = scrape(client)
    key = dict(endpoint="generate", status="400", reason="invalid_request_error")
    assert metric(after, "cobatch_requests_rejected_total", **key) - metric(
        before, "cobatch_requests_rejected_total", **key) == 1


def test_full_queue_is_429_with_retry_after_and_hangups_free_everything(client, live):
    engine = live.engine
    unchanged_finished = metric(scrape(client), "cobatch_requests_total")
    running = raw_http_request(live.port, "/generate", {"prompt": "Tell a long story.", "max_tokens": 1500,
                                                         "stream": True})
    wait_until(lambda: engine.stats().running == 1, 30, "first request did not start")
    waiting = raw_http_request(live.port, "/generate", {"prompt": "Queued one", "max_tokens": 1500})
    wait_until(lambda: engine.stats().waiting["batch"] == 1, 30, "second request was not queued")

    response = client.post("/generate", json=GOOD)
    error = assert_error(response, 429, "queue is full", "retry later")
    assert error["code"] == "queue_full" and int(response.headers["retry-after"]) >= 1
    assert int(response.headers["retry-after-ms"]) == 1000 * int(response.headers["retry-after"])
    assert engine.stats().running == 1 and engine.stats().waiting["batch"] == 1  # untouched by the 429

    waiting.close()  # a client leaving while queued takes its request out of the queue
    wait_until(lambda: engine.stats().waiting["batch"] == 0, 10, "queued request not cancelled")
    assert engine.stats().running == 1
    running.close()  # and one leaving mid-stream stops generation and frees its KV
    assert_engine_idle(engine)
    after = scrape(client)
    assert metric(after, "cobatch_requests_total", finish_reason="cancelled") >= 2
    assert metric(after, "cobatch_requests_total") - unchanged_finished == 2
    assert metric(after, "cobatch_client_disconnects_total") >= 2


# ---- an exception inside one request fails that request only ---------------------------------

class _FailedHandle:
    """Stands in for an engine handle whose request failed inside the engine."""

    request_id = "failed-1"
    prompt_tokens = 1

    def __init__(self):
        self._result = GenerationResult(
            self.request_id, "", (), FinishReason.ERROR,
            RequestMetrics(1, 0, 0.0, None, 0.0, 0.0, 0.0), error="sampler blew up",
        )

    def done(self):
        return True

    def on_result(self, callback):
        callback(self._result)  # already ended: called at once, as RequestHandle does

    def cancel(self):
        pass

    def __await__(self):
        async def result():
            return self._result
        return result().__await__()

    def __aiter__(self):
        async def nothing():
            return
            yield
        return nothing()


class _FaultyEngine:
    """The real engine, except that some prompts make submit raise or fail inside the engine."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def submit(self, request):
        if request.prompt == "explode":
            raise RuntimeError("boom in submit")
        if request.prompt == "fail inside":
            return _FailedHandle()
        return self._engine.submit(request)


@pytest.fixture
def faulty(live):
    with running_server(lambda: _FaultyEngine(live.engine), live.engine) as server:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            yield c


def test_exception_in_one_request_is_500_and_the_server_carries_on(faulty, live):
    assert_error(faulty.post("/generate", json={"prompt": "explode", "max_tokens": 2}), 500,
                 "RuntimeError: boom in submit")
    error = assert_error(faulty.post("/generate", json={"prompt": "fail inside", "max_tokens": 2}), 500,
                         "generation failed: sampler blew up")
    assert error["code"] == "generation_failed"
    with faulty.stream("POST", "/generate", json={"prompt": "fail inside", "stream": True}) as r:
        events = list(sse_events(r.iter_lines()))
    assert events[-1][0] == "error" and "sampler blew up" in json.loads(events[-1][1])["error"]["message"]
    ok = faulty.post("/generate", json={"prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["metrics"]["tokens_generated"] >= 1
    assert faulty.get("/health").json()["status"] == "ok"
    assert_engine_idle(live.engine)


def _served_by(handler):
    """What the server's error boundary makes of a handler's outcome, and what it counted."""
    metrics = ServerMetrics(engine_stats=lambda: None, in_flight=lambda: 0)
    route = _api(handler, SimpleNamespace(metrics=metrics), "generate")
    request = StarletteRequest({"type": "http", "method": "POST", "path": "/generate", "headers": []})
    response = asyncio.run(route(request))
    rejected = sum(s.value for m in metrics.rejections.collect() for s in m.samples if s.name.endswith("_total"))
    return response.status_code, rejected


def test_a_client_gone_before_its_body_was_read_is_not_a_rejection_or_a_server_error():
    async def hung_up(request, ctx):
        raise ClientDisconnect()

    async def broken(request, ctx):
        raise RuntimeError("boom")

    assert _served_by(hung_up) == (499, 0)
    assert _served_by(broken) == (500, 1)  # a real failure still is one
