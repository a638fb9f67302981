"""Tenants on a live server: a keys file's limits answer 429 with OpenAI's headers at exactly the
configured points and keep nothing of a refused request, a tier the key may not use is a 403,
a key's default tier applies, batch jobs count for their creator, and per-tenant metrics show
it all without /health or /metrics giving a key away."""
from __future__ import annotations

import io
import json

import httpx
import openai
import pytest

from server.tenants import parse_tenants
from tests.server_fixtures import assert_engine_idle, metric, running_server, scrape, shared_engine, wait_until

pytestmark = pytest.mark.model

PROMPT = "Count slowly: one, two, three,"
TOKENS_PER_REQUEST_MAX = 8
TENANTS = {
    "busy": {"keys": ["sk-busy"], "max_in_flight": 2},
    "metered": {"keys": ["sk-metered"]},  # tokens_per_minute set below, from the prompt's length
    "other": {"keys": ["sk-other"]},
    "nightly": {"keys": ["sk-nightly"], "tiers": ["batch"], "default_tier": "batch"},
    "chatty": {"keys": ["sk-chatty"], "default_tier": "interactive", "weight": 2},
}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = shared_engine()
    per_request = len(engine.tokenize(PROMPT)) + TOKENS_PER_REQUEST_MAX
    tenants = json.loads(json.dumps(TENANTS))
    tenants["metered"]["tokens_per_minute"] = 3 * per_request
    keys = tuple(parse_tenants({"tenants": tenants}))
    with running_server(lambda: engine, engine, tenant_keys=keys, data_dir=tmp_path_factory.mktemp("jobs")) as live:
        live.per_request = per_request
        yield live
    assert_engine_idle(engine)


def generate(client: httpx.Client, key: str, **body) -> httpx.Response:
    return client.post("/generate", json={"prompt": PROMPT, "max_tokens": TOKENS_PER_REQUEST_MAX, "ignore_eos": True,
                                          **body}, headers=auth(key))


def test_the_request_past_max_in_flight_gets_a_429_with_the_headers_and_others_are_served(server):
    client = httpx.Client(base_url=server.url, timeout=120)
    streams, readers = [], []
    try:
        for _ in range(2):  # two long requests in flight: the key's limit
            stream = client.stream("POST", "/generate", headers=auth("sk-busy"),
                                   json={"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True})
            response = stream.__enter__()
            streams.append(stream)
            assert response.status_code == 200
            # An accepted answer carries the limits as they stand with it counted.
            assert response.headers["x-ratelimit-limit-requests"] == "2"
            assert response.headers["x-ratelimit-remaining-requests"] == str(1 - len(readers))
            # Its first event: it is in the engine. The reader is kept: a line iterator that is
            # garbage-collected closes the connection, and the server cancels the request.
            readers.append(response.iter_lines())
            next(readers[-1])
        refused = generate(client, "sk-busy")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.headers["x-ratelimit-limit-requests"] == "2"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"] == "1s" and refused.headers["retry-after"] == "1"
        # Refused at the door, before the body is read: even one that is not JSON gets the 429,
        # in the shape of the route's API.
        not_json = client.post("/v1/chat/completions", content=b"{not json", headers=auth("sk-busy"))
        assert not_json.status_code == 429 and not_json.json()["error"]["code"] == "rate_limit_exceeded"
        assert not_json.headers["retry-after"] == "1"
        anthropic_shape = client.post("/v1/messages", json={}, headers={"x-api-key": "sk-busy"})
        assert anthropic_shape.status_code == 429
        assert anthropic_shape.json()["type"] == "error" and anthropic_shape.json()["error"]["type"] == "rate_limit_error"
        assert client.post("/tokenize", json={"prompt": "hi"}, headers=auth("sk-busy")).status_code == 200  # not generation
        other = generate(client, "sk-other")  # another tenant is not held back by busy's limit
        assert other.status_code == 200 and other.json()["metrics"]["tokens_generated"] == TOKENS_PER_REQUEST_MAX
        samples = scrape(client)
        assert metric(samples, "cobatch_tenant_requests_in_flight", tenant="busy") == 2
        assert metric(samples, "cobatch_tenant_refusals_total", tenant="busy", reason="in_flight") == 3
        assert metric(samples, "cobatch_requests_rejected_total", endpoint="chat_completions", status="429",
                      reason="rate_limit_exceeded") == 1
    finally:
        for stream in streams:
            stream.__exit__(None, None, None)  # hang up: the requests are cancelled
    wait_until(lambda: server.ctx.service.quotas.in_flight().get("busy") == 0, 30, "busy's requests did not end")
    produced = metric(scrape(client), "cobatch_tenant_tokens_produced_total", tenant="busy")
    assert generate(client, "sk-busy").status_code == 200
    # Counted as computed, by tenant (tokens from the first-token lane are not a step's).
    assert metric(scrape(client), "cobatch_tenant_tokens_produced_total", tenant="busy") - produced in (
        TOKENS_PER_REQUEST_MAX - 1, TOKENS_PER_REQUEST_MAX)
    # What the openai client reads of an accepted chat: its limit, and the place it took.
    busy = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-busy", max_retries=0)
    raw = busy.chat.completions.with_raw_response.create(
        model=busy.models.list().data[0].id, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert raw.headers["x-ratelimit-limit-requests"] == "2" and raw.headers["x-ratelimit-remaining-requests"] == "1"
    assert raw.parse().choices[0].message is not None


def test_clients_keeping_exactly_the_limit_in_flight_are_never_refused(server):
    """A request's place is given back as its result is published, before its answer is sent, so
    the client's next request never finds it still counted."""
    import concurrent.futures

    def keep_sending(_: int) -> list[int]:
        with httpx.Client(base_url=server.url, timeout=120) as own:
            return [generate(own, "sk-busy", max_tokens=1).status_code for _ in range(25)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # busy's limit: 2 in flight
        statuses = [code for codes in pool.map(keep_sending, range(2)) for code in codes]
    assert statuses == [200] * 50


def test_tokens_per_minute_refuse_exactly_past_the_limit_and_a_refusal_keeps_nothing(server):
    client = httpx.Client(base_url=server.url, timeout=120)
    limit = 3 * server.per_request
    for i in range(3):
        answer = generate(client, "sk-metered")
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ratelimit-limit-tokens"] == str(limit)
        assert answer.headers["x-ratelimit-remaining-tokens"] == str(limit - (i + 1) * server.per_request)
    refused = generate(client, "sk-metered", max_tokens=1)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    headers = refused.headers
    assert headers["x-ratelimit-limit-tokens"] == str(limit) and headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-reset-tokens"].endswith("s") and 50 <= int(headers["retry-after"]) <= 60
    assert "x-ratelimit-limit-requests" not in headers
    again = generate(client, "sk-metered", max_tokens=1)  # the refusal took nothing: same answer
    assert again.status_code == 429 and again.headers["x-ratelimit-remaining-tokens"] == "0"
    assert generate(client, "sk-other").status_code == 200
    samples = scrape(client)
    assert metric(samples, "cobatch_tenant_refusals_total", tenant="metered", reason="tokens_per_minute") == 2
    assert metric(samples, "cobatch_tenant_generated_tokens_total", tenant="metered") == 3 * TOKENS_PER_REQUEST_MAX


def test_a_tier_the_key_may_not_use_is_a_403_and_the_keys_default_tier_applies(server):
    nightly = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-nightly", max_retries=0)
    model = nightly.models.list().data[0].id
    chat = dict(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        nightly.chat.completions.create(**chat, service_tier="priority")
    assert refused.value.status_code == 403 and refused.value.body["code"] == "tier_not_allowed"
    # A chat is interactive by the route's default, but this key's default is batch.
    assert nightly.chat.completions.create(**chat).service_tier == "flex"
    chatty = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-chatty", max_retries=0)
    # Completions are batch by the route's default; this key's default is interactive.
    assert chatty.completions.create(model=model, prompt="Hi", max_tokens=2).service_tier == "priority"
    samples = scrape(httpx.Client(base_url=server.url))
    assert metric(samples, "cobatch_tenant_refusals_total", tenant="nightly", reason="tier_not_allowed") == 1
    assert metric(samples, "cobatch_tenant_requests_total", tenant="nightly", priority="batch") == 1
    assert metric(samples, "cobatch_tenant_requests_total", tenant="chatty", priority="interactive") == 1


def test_batch_jobs_count_for_the_tenant_that_created_them(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-nightly", max_retries=0)
    model = client.models.list().data[0].id
    before = metric(scrape(httpx.Client(base_url=server.url)), "cobatch_tenant_requests_total", tenant="nightly")
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": model, "prompt": f"{i} and", "max_tokens": 2}} for i in range(3)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", 120, "the batch did not complete")
    samples = scrape(httpx.Client(base_url=server.url))
    assert metric(samples, "cobatch_tenant_requests_total", tenant="nightly") == before + 3
    assert metric(samples, "cobatch_tenant_requests_total", tenant="anonymous") == 0


def test_health_and_metrics_give_no_key_away_and_the_log_line_names_the_tenant(server, caplog):
    client = httpx.Client(base_url=server.url, timeout=60)
    caplog.set_level("INFO", logger="cobatch.server")
    assert generate(client, "sk-other").status_code == 200
    wait_until(lambda: any("tenant=other" in r.getMessage() for r in caplog.records), 10, "no log line")
    health = client.get("/health").text
    metrics = client.get("/metrics").text
    for name, tenant in TENANTS.items():
        for key in tenant["keys"]:
            assert key not in health and key not in metrics
            assert not any(key in r.getMessage() for r in caplog.records)
        assert name not in health
    assert 'tenant="other"' in metrics


def test_an_unknown_key_is_still_a_401(server):
    response = httpx.post(f"{server.url}/generate", json={"prompt": "x"}, headers=auth("sk-nobody"))
    assert response.status_code == 401
