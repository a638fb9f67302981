"""Priority, deadlines and per-tier queues through HTTP, on the shared live server."""
from __future__ import annotations

import pytest

from tests.server_fixtures import generate_stream, metric, scrape

pytestmark = pytest.mark.model


def test_timeout_ends_a_long_generation_with_504(http):
    response = http.post("/generate", json={"prompt": "Tell me a long story.", "max_tokens": 2000,
                                             "timeout": 0.3})
    if response.status_code == 200:  # it ended by itself (end of text) before the deadline
        body = response.json()
        assert body["finish_reason"] == "stop" and body["metrics"]["latency_ms"] < 300
        return
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "timeout"


def test_timeout_in_a_stream_ends_with_finish_reason_timeout(http):
    events = generate_stream(http, {"prompt": "Count from one to one thousand in words.", "max_tokens": 1500,
                                    "timeout": 0.5, "temperature": 0})
    name, last = events[-1]
    assert name == "error" and last["finish_reason"] == "timeout", events[-1]


def test_timeout_is_validated(http, openai_client):
    model = openai_client.models.list().data[0].id
    for bad in (0, -2, "1", 1e9):
        response = http.post("/generate", json={"prompt": "Hi", "timeout": bad})
        assert response.status_code == 400 and response.json()["error"]["param"] == "timeout"
    response = http.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 2, "timeout": 30,
                                                  "priority": "interactive"})
    assert response.status_code == 200, response.text


def test_per_tier_metrics_are_exported(http):
    before = scrape(http)
    http.post("/generate", json={"prompt": "Hi", "max_tokens": 2, "priority": "interactive", "ignore_eos": True})
    text = scrape(http)
    # Tokens as computed: this request's two, and its prompt (a cached part is not computed).
    produced = "cobatch_priority_tokens_produced_total"
    assert metric(text, produced, priority="interactive") - metric(before, produced, priority="interactive") == 2
    computed = "cobatch_priority_prompt_tokens_computed_total"
    assert metric(text, computed, priority="interactive") > metric(before, computed, priority="interactive")
    assert metric(text, "cobatch_priority_admissions_total", priority="interactive") >= 1
    assert metric(text, "cobatch_priority_running_sequences", priority="batch") == 0
    assert any(name == "cobatch_engine_steps_interrupted_total" for name, _ in text)
    assert metric(text, "cobatch_time_to_first_token_seconds_count", priority="interactive") >= 1
