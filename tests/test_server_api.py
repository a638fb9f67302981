"""/generate, /health and /metrics against a real uvicorn server and the real model."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.server_fixtures import assert_engine_idle, generate_stream, metric, scrape

pytestmark = pytest.mark.model

METRIC_KEYS = {
    "latency_ms", "tokens_per_second", "queue_time_ms", "ttft_ms", "generation_time_ms",
    "prompt_tokens", "tokens_generated", "cached_tokens", "forced_tokens", "drafted_tokens", "accepted_tokens",
}


def test_generate_returns_text_finish_reason_and_measured_metrics(http, live):
    prompt = "The capital of France is"
    response = http.post("/generate", json={"prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body["text"], str) and body["text"]
    assert body["finish_reason"] in ("stop", "length")
    assert "structured_data" not in body  # only present when format is json
    m = body["metrics"]
    assert set(m) == METRIC_KEYS
    assert m["prompt_tokens"] == len(live.engine.tokenize(prompt))
    assert 1 <= m["tokens_generated"] <= 8
    assert 0 < m["ttft_ms"] <= m["latency_ms"]
    assert m["generation_time_ms"] <= m["latency_ms"] and m["queue_time_ms"] >= 0
    assert m["tokens_per_second"] > 0
    assert response.headers["x-request-id"] == body["id"]


def test_greedy_requests_are_reproducible(http):
    body = {"prompt": "List three colours:", "max_tokens": 6, "temperature": 0}
    first, second = (http.post("/generate", json=body).json() for _ in range(2))
    assert first["text"] == second["text"]


def test_seeded_sampling_is_reproducible(http):
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 1234}
    assert http.post("/generate", json=body).json()["text"] == http.post("/generate", json=body).json()["text"]


def test_max_tokens_is_honoured(http):
    body = http.post("/generate", json={"prompt": "Count: 1, 2, 3,", "max_tokens": 3, "temperature": 0}).json()
    assert body["finish_reason"] in ("length", "stop") and body["metrics"]["tokens_generated"] <= 3


def test_stop_string_ends_generation_and_is_not_returned(http):
    # Under 16 tokens: a full KV block could be served from the prefix cache on the second
    # request, and reused cells need not give bit-identical logits, so greedy text could differ.
    prompt = "Count: 1, 2, 3, 4,"
    free = http.post("/generate", json={"prompt": prompt, "max_tokens": 8, "temperature": 0}).json()["text"]
    assert "," in free, free
    stopped = http.post(
        "/generate", json={"prompt": prompt, "max_tokens": 8, "temperature": 0, "stop": [","]}
    ).json()
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == free[: free.index(",")]


def test_concurrent_requests_of_both_priorities(live):
    before = scrape(httpx.Client(base_url=live.url))

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=live.url, timeout=120) as c:
            jobs = [
                c.post("/generate", json={
                    "prompt": f"Write a word about number {i}.", "max_tokens": 4,
                    "priority": "interactive" if i % 2 else "batch",
                })
                for i in range(12)
            ]
            return await asyncio.gather(*jobs)

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 12
    assert all(r.json()["metrics"]["tokens_generated"] >= 1 for r in responses)
    after = scrape(httpx.Client(base_url=live.url))
    for priority in ("interactive", "batch"):
        done = metric(after, "cobatch_requests_total", endpoint="generate", priority=priority) - metric(
            before, "cobatch_requests_total", endpoint="generate", priority=priority
        )
        assert done == 6, priority
    assert_engine_idle(live.engine)


def test_streaming_sends_deltas_then_a_final_event(http):
    events = generate_stream(http, {"prompt": "Tell me about the sea.", "max_tokens": 8, "temperature": 0})
    names = [name for name, _ in events]
    assert names[-1] == "done" and set(names[:-1]) == {"delta"}
    final = events[-1][1]
    assert "".join(data["text"] for name, data in events[:-1]) == final["text"]
    assert len(events) >= 2
    assert final["finish_reason"] in ("stop", "length") and set(final["metrics"]) == METRIC_KEYS
    same = http.post("/generate", json={"prompt": "Tell me about the sea.", "max_tokens": 8, "temperature": 0})
    assert same.json()["text"] == final["text"]


def test_health_reports_model_queues_kv_and_memory(http):
    response = http.get("/health")
    assert response.status_code == 200
    health = response.json()
    assert health["status"] == "ok"
    assert health["model"]["id"] == "gemma-3-270m-Q4_K_M" and health["model"]["chat_style"] == "gemma"
    assert health["model"]["file"] == "gemma-3-270m-Q4_K_M.gguf"
    assert health["queue"] == {"interactive": 0, "batch": 0}
    assert health["running"] == 0
    assert health["kv"]["cells_total"] >= 4096 and health["kv"]["cells_used"] == 0
    assert health["process"]["rss_bytes"] > 50 * 1024 * 1024  # the model is mapped in
    assert health["decode_threads"] >= 1 and health["thread_switches"] >= 0
    assert health["suspensions"] >= 0 and health["preemptions"] >= 0


def test_metrics_move_when_requests_run(http):
    before = scrape(http)
    body = http.post("/generate", json={"prompt": "Hello there", "max_tokens": 5, "priority": "interactive"}).json()
    after = scrape(http)
    delta = lambda name, **labels: metric(after, name, **labels) - metric(before, name, **labels)  # noqa: E731
    reason = body["finish_reason"]
    assert delta("cobatch_requests_total", endpoint="generate", priority="interactive", finish_reason=reason) == 1
    assert delta("cobatch_generated_tokens_total", priority="interactive") == body["metrics"]["tokens_generated"]
    assert delta("cobatch_prompt_tokens_total", priority="interactive") == body["metrics"]["prompt_tokens"]
    assert delta("cobatch_time_to_first_token_seconds_count", priority="interactive") == 1
    assert delta("cobatch_request_latency_seconds_sum", priority="interactive") == pytest.approx(
        body["metrics"]["latency_ms"] / 1000, rel=1e-6)
    assert delta("cobatch_queue_time_seconds_count", priority="interactive") == 1
    # One interval between each token-giving step and the one before (no forced tokens here).
    assert delta("cobatch_inter_token_latency_seconds_count", priority="interactive") == (
        body["metrics"]["tokens_generated"] - 1)
    assert metric(after, "cobatch_interactive_token_target_seconds") == pytest.approx(0.15)
    assert delta("cobatch_latency_bounded_steps_total") == 0  # nothing ran beside it
    assert delta("cobatch_engine_steps_total") >= body["metrics"]["tokens_generated"]
    assert metric(after, "cobatch_kv_cells_total") >= 4096
    assert metric(after, "cobatch_decode_threads") >= 1
    assert delta("cobatch_suspensions_total") == 0 and delta("cobatch_preemptions_total") == 0
    assert metric(after, "cobatch_kv_cells_used") == 0 and metric(after, "cobatch_running_sequences") == 0
    assert metric(after, "cobatch_process_resident_memory_bytes") > 0
    assert ("cobatch_waiting_requests", (("priority", "batch"),)) in after
    assert 0 < metric(after, "cobatch_prefix_cache_reuse_share") < 1  # a measured share, moved from its prior
    assert metric(after, "cobatch_prefix_cache_reuse_share") != metric(before, "cobatch_prefix_cache_reuse_share")


def test_kv_gauges_are_read_while_requests_run(http, live):
    with http.stream("POST", "/generate", json={"prompt": "Describe a forest.", "max_tokens": 200, "stream": True}) as r:
        next(line for line in r.iter_lines() if line.startswith("data:"))  # generating now
        during = scrape(http)
    # Leaving the block hung up; the client fixture checks the request was cancelled and freed.
    assert metric(during, "cobatch_running_sequences") == 1
    assert metric(during, "cobatch_kv_cells_used") > 0
    assert 0 < metric(during, "cobatch_kv_usage_ratio") < 1


def test_a_json_answer_reports_its_forced_tokens_in_metrics_and_prometheus(http, live):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    before = metric(scrape(http), "cobatch_tokens_forced_total")
    response = http.post("/generate", json={"prompt": "A city as JSON:", "max_tokens": 24, "format": "json",
                                            "json_schema": schema, "seed": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body["structured_data"]) == {"city"}
    forced = body["metrics"]["forced_tokens"]
    assert 0 < forced < body["metrics"]["tokens_generated"]  # `{"city` is forced; the name is sampled
    assert metric(scrape(http), "cobatch_tokens_forced_total") - before == forced


def test_health_and_models_show_no_path(http, live):
    """Anyone who reaches the port reads /health: the model's file name, never where it lives."""
    directory = str(Path(live.engine.model.path).resolve().parent)
    for route in ("/health", "/v1/models", "/v1/models/gemma-3-270m-Q4_K_M.gguf"):
        response = http.get(route)
        assert response.status_code == 200, (route, response.text)
        assert directory not in response.text and "path" not in response.json().get("model", {}), route
