"""A bounded soak: 300 mixed requests at concurrency 32, some cancelled, some malformed.

Every request must end with a response or a clear error, and afterwards the engine must be
idle with no KV held by any seq id, and memory back near where it started.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter

import httpx
import pytest

from server.health import process_rss_bytes
from tests.server_fixtures import assert_engine_idle, shared_engine, metric, running_server, scrape, wait_until

pytestmark = pytest.mark.model

# Kept small per request (short prompts, <= 4 new tokens) so 300 requests take about a minute
# on 2 cores; COBATCH_SOAK_REQUESTS makes it longer or shorter.
N_REQUESTS = int(os.environ.get("COBATCH_SOAK_REQUESTS", "300"))
CONCURRENCY = 32
MODEL = "gemma-3-270m-Q4_K_M"
RSS_SLACK_BYTES = 64 * 1024 * 1024

PROMPTS = ["Hello", "Name a fruit.", "2 + 2 =", "The moon is", "Cats are", "Two planets:", "Today"]
MALFORMED = [
    ('{"prompt": "x", ', 400), ('{"prompt": ""}', 400), ('{"prompt": "x", "max_tokens": -1}', 400),
    ('{"prompt": "x", "wat": 1}', 400), ('{"prompt": "x", "top_p": 7}', 400), ("[]", 400),
    ('{"prompt": "x", "format": "json", "stop": "}"}', 400),
    ('{"prompt": "x", "logit_bias": {"a": 1}}', 400),
]
KINDS = [("generate", 40), ("stream", 15), ("stream_hangup", 10), ("wait_hangup", 7),
         ("malformed", 10), ("chat", 10), ("completion_stream", 8)]


@pytest.fixture(scope="module")
def live():
    engine = shared_engine()
    with running_server(lambda: engine, engine) as server:
        yield server


def _plan(rng: random.Random) -> list[str]:
    names, weights = zip(*KINDS)
    return rng.choices(names, weights=weights, k=N_REQUESTS)


async def _one(client: httpx.AsyncClient, kind: str, rng: random.Random) -> tuple[str, str]:
    """Runs one request; returns (kind, outcome) where outcome is 'ok', 'rejected' or 'hung_up'."""
    prompt = rng.choice(PROMPTS)
    body = {"prompt": prompt, "max_tokens": rng.randint(1, 4), "priority": rng.choice(["interactive", "batch"])}
    if kind == "generate":
        r = await client.post("/generate", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["finish_reason"] in ("stop", "length")
        return kind, "ok"
    if kind == "stream":
        async with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            text = [line async for line in r.aiter_lines()]
        assert "event: done" in text, text
        return kind, "ok"
    if kind == "stream_hangup":
        async with client.stream("POST", "/generate", json={**body, "max_tokens": 100, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    break  # leaving the block closes the connection mid-stream
        return kind, "hung_up"
    if kind == "wait_hangup":
        try:
            await asyncio.wait_for(client.post("/generate", json={**body, "max_tokens": 100}),
                                   timeout=rng.uniform(0.05, 0.5))
            return kind, "ok"  # it was quick enough: also fine
        except asyncio.TimeoutError:
            return kind, "hung_up"
    if kind == "malformed":
        raw, status = rng.choice(MALFORMED)
        r = await client.post("/generate", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        assert r.json()["error"]["message"]
        return kind, "rejected"
    if kind == "chat":
        r = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": body["max_tokens"]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        return kind, "ok"
    if kind == "completion_stream":
        async with client.stream("POST", "/v1/completions", json={
                "model": MODEL, "prompt": prompt, "max_tokens": body["max_tokens"], "stream": True}) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][5:])["choices"][0]["finish_reason"]
        return kind, "ok"
    raise AssertionError(kind)


async def _soak(url: str, plan: list[str], rng: random.Random) -> list[tuple[str, str]]:
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY * 2, max_keepalive_connections=CONCURRENCY)

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def guarded(kind: str, seed: int) -> tuple[str, str]:
            async with gate:
                return await _one(client, kind, random.Random(seed))

        return await asyncio.gather(*(guarded(kind, rng.randrange(2**32)) for kind in plan))


def test_soak_mixed_traffic_leaves_nothing_behind(live):
    engine = live.engine
    rng = random.Random(20240601)
    with httpx.Client(base_url=live.url, timeout=60) as client:
        asyncio.run(_soak(live.url, ["generate", "stream", "chat"] * 4, rng))  # warm-up: allocator, buffers
        assert_engine_idle(engine)
        baseline_rss = process_rss_bytes()
        before = scrape(client)

        plan = _plan(rng)
        started = time.monotonic()
        outcomes = asyncio.run(_soak(live.url, plan, rng))
        elapsed = time.monotonic() - started

        assert len(outcomes) == N_REQUESTS
        tally = Counter(outcomes)
        assert_engine_idle(engine, timeout=30)
        after = scrape(client)
        grew = process_rss_bytes() - baseline_rss
        print(f"soak: {N_REQUESTS} requests in {elapsed:.1f}s; {dict(tally)}; RSS {grew / 2**20:+.1f} MiB")

        n_malformed = sum(n for (kind, _), n in tally.items() if kind == "malformed")
        n_ok = sum(n for (_, outcome), n in tally.items() if outcome == "ok")
        finished = metric(after, "cobatch_requests_total") - metric(before, "cobatch_requests_total")
        rejected = metric(after, "cobatch_requests_rejected_total") - metric(before, "cobatch_requests_rejected_total")
        assert rejected == n_malformed
        # Every accepted request was accounted for when it ended; hang-ups may end before submit.
        assert n_ok <= finished <= N_REQUESTS - n_malformed
        assert metric(after, "cobatch_requests_total", finish_reason="cancelled") > metric(
            before, "cobatch_requests_total", finish_reason="cancelled")
        assert metric(after, "cobatch_requests_total", finish_reason="error") == 0
        assert grew < RSS_SLACK_BYTES, f"RSS grew by {grew / 2**20:.1f} MiB"
        assert metric(after, "cobatch_kv_cells_used") == 0
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["running"] == 0 and health["queue"] == {"interactive": 0, "batch": 0}
        assert live.ctx.state.in_flight == 0
    _every_seq_id_is_free_again(live)


def _every_seq_id_is_free_again(live) -> None:
    """max_running requests can all run at once: no seq id was lost to a leaked request."""
    engine = live.engine
    n = engine.config.max_running

    async def fill() -> None:
        all_running = asyncio.Event()

        async def hold(client: httpx.AsyncClient, i: int) -> None:
            # Greedy counting runs on without an end token, so all n are still running together.
            body = {"prompt": f"{i}, {i + 1}, {i + 2},", "max_tokens": 400, "temperature": 0, "stream": True}
            async with client.stream("POST", "/generate", json=body) as r:
                async for _ in r.aiter_lines():  # keep reading: leaving the loop hangs up
                    if all_running.is_set():
                        break

        async def watch() -> None:
            await asyncio.to_thread(wait_until, lambda: engine.stats().running == n, 60, f"{n} never ran at once")
            all_running.set()

        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            await asyncio.gather(watch(), *(hold(client, i) for i in range(n)))

    asyncio.run(fill())
    assert_engine_idle(engine)
