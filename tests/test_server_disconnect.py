"""A client that hangs up cancels its request at once and leaves no seq id or KV behind."""
from __future__ import annotations

import gc
import logging
import socket

import pytest

from tests.server_fixtures import (
    assert_engine_idle,
    kv_positions,
    metric,
    raw_http_request,
    scrape,
    wait_until,
)

pytestmark = pytest.mark.model

LONG = {"prompt": "Write a very long story about a lighthouse keeper.", "max_tokens": 2000, "temperature": 0}
# Steps the engine may take between the hang-up reaching the server and the cancel being applied:
# the cancel lands before the next step, plus slack for the socket close to be noticed.
MAX_STEPS_AFTER_HANGUP = 5
PROMPT_TOKENS = 12  # LONG's prompt: KV positions past this mean tokens are being generated


def _cancelled(http) -> float:
    return metric(scrape(http), "cobatch_requests_total", finish_reason="cancelled")


def _hang_up_and_check_freed(live, sock: socket.socket, monkeypatch) -> None:
    """Hang up; the server must notice, and the engine must drop the request within one step
    of being told (the step already under way may finish), freeing its seq id and KV."""
    engine = live.engine
    assert engine.stats().running == 1 and max(kv_positions(engine)) > 0  # it really holds KV
    noticed_at_step = []
    observe = live.ctx.metrics.observe_disconnect

    def record(*args):
        noticed_at_step.append(engine.stats().steps)
        observe(*args)

    monkeypatch.setattr(live.ctx.metrics, "observe_disconnect", record)
    steps = engine.stats().steps
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    wait_until(lambda: engine.stats().running == 0, 10, "request still running after hang-up")
    assert len(noticed_at_step) == 1, "the server did not see the hang-up"
    assert engine.stats().steps - noticed_at_step[0] <= 1
    assert engine.stats().steps - steps <= MAX_STEPS_AFTER_HANGUP
    assert_engine_idle(engine)


def test_hang_up_mid_stream_cancels_and_frees_kv(live, http, monkeypatch):
    before = _cancelled(http)
    sock = raw_http_request(live.port, "/generate", {**LONG, "stream": True})
    received = b""
    while b"event: delta" not in received:  # wait for tokens to flow
        received += sock.recv(4096)
    _hang_up_and_check_freed(live, sock, monkeypatch)
    assert _cancelled(http) - before == 1


def test_hang_up_while_waiting_for_a_non_streamed_answer(live, http, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="asyncio")
    before = _cancelled(http)
    disconnects = metric(scrape(http), "cobatch_client_disconnects_total", endpoint="generate")
    sock = raw_http_request(live.port, "/generate", LONG)
    wait_until(lambda: live.engine.stats().running == 1, 30, "not started")
    wait_until(lambda: max(kv_positions(live.engine)) > PROMPT_TOKENS + 2, 30, "not generating")
    _hang_up_and_check_freed(live, sock, monkeypatch)
    after = scrape(http)
    assert metric(after, "cobatch_requests_total", finish_reason="cancelled") - before == 1
    assert metric(after, "cobatch_client_disconnects_total", endpoint="generate") - disconnects == 1
    gc.collect()  # an unread exception is logged when its future is collected
    assert not [r for r in caplog.records if r.name == "asyncio"], "a hang-up was logged as an error"


def test_hang_up_on_an_openai_completion(live, http, monkeypatch):
    sock = raw_http_request(live.port, "/v1/completions",
                            {"model": "gemma-3-270m-Q4_K_M", "prompt": LONG["prompt"], "max_tokens": 2000})
    wait_until(lambda: max(kv_positions(live.engine)) > PROMPT_TOKENS + 2, 30, "not generating")
    _hang_up_and_check_freed(live, sock, monkeypatch)


def test_httpx_client_closing_a_stream_early(live, http):
    with http.stream("POST", "/generate", json={**LONG, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                break
    assert_engine_idle(live.engine)
    assert http.post("/generate", json={"prompt": "Still fine?", "max_tokens": 3}).status_code == 200
    assert_engine_idle(live.engine)
