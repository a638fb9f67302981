"""The tier a request is served in: OpenAI's `service_tier`, cobatch's `priority`, and the route's
default under `--default-tier`, read as clients send them and echoed as OpenAI does."""
from __future__ import annotations

import httpx
import openai
import pytest

from server.errors import BadRequest
from server.openai_schemas import parse_chat, parse_completion
from server.schemas import parse_generate
from server.tiers import route_default
from tests.server_fixtures import metric, running_server, scrape, shared_engine

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize("fields, default, served", [
    ({}, "interactive", "interactive"),
    ({}, "batch", "batch"),
    ({"service_tier": "auto"}, "batch", "batch"),
    ({"service_tier": "default"}, "interactive", "interactive"),
    ({"service_tier": None}, "interactive", "interactive"),
    ({"service_tier": "flex"}, "interactive", "batch"),
    ({"service_tier": "priority"}, "batch", "interactive"),
    ({"priority": "batch", "service_tier": "priority"}, "interactive", "batch"),  # cobatch's own field wins
    ({"priority": "interactive", "service_tier": "flex"}, "batch", "interactive"),
])
def test_the_tier_comes_from_priority_then_service_tier_then_the_routes_default(fields, default, served):
    assert parse_chat({**CHAT, **fields}, n_ctx=64, tier=default).specs[0].priority == served
    assert parse_completion({**COMPLETION, **fields}, n_ctx=64, tier=default).specs[0].priority == served
    assert parse_generate({"prompt": "hi", **fields}, n_ctx=64, tier=default)[0].priority == served


@pytest.mark.parametrize("fields, param", [({"service_tier": "scale"}, "service_tier"),
                                           ({"service_tier": 3}, "service_tier"),
                                           ({"priority": "high"}, "priority")])
def test_a_tier_this_server_does_not_have_is_a_400_naming_the_field(fields, param):
    with pytest.raises(BadRequest) as err:
        parse_chat({**CHAT, **fields}, n_ctx=64)
    assert err.value.param == param


def test_auto_makes_chats_interactive_and_the_rest_batch():
    assert route_default("auto", "chat_completions") == "interactive"
    assert [route_default("auto", e) for e in ("completions", "generate")] == ["batch", "batch"]
    for setting in ("interactive", "batch"):
        assert {route_default(setting, e) for e in ("chat_completions", "completions", "generate")} == {setting}
    with pytest.raises(ValueError):
        route_default("fast", "chat_completions")


def _served(samples: dict, tier: str) -> float:
    return metric(samples, "cobatch_requests_total", endpoint="chat_completions", priority=tier)


@pytest.mark.model
def test_the_openai_client_with_no_extra_fields_gets_the_interactive_tier_and_flex_gets_batch():
    engine = shared_engine()
    with running_server(lambda: engine, engine) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        ask = dict(model=client.models.list().data[0].id, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        admitted = metric(scrape(http), "cobatch_priority_admissions_total", priority="interactive")
        plain = client.chat.completions.create(**ask)
        assert plain.service_tier == "priority"
        assert _served(scrape(http), "interactive") == 1
        assert metric(scrape(http), "cobatch_priority_admissions_total", priority="interactive") > admitted
        flex = client.chat.completions.create(**ask, service_tier="flex")
        assert flex.service_tier == "flex" and _served(scrape(http), "batch") == 1
        chunks = list(client.chat.completions.create(**ask, stream=True, service_tier="auto"))
        assert chunks and {c.service_tier for c in chunks} == {"priority"}
        completion = client.completions.create(model=ask["model"], prompt="Hi", max_tokens=2)
        assert completion.model_extra["service_tier"] == "flex"  # completions default to the batch tier
        client.close()


@pytest.mark.model
def test_default_tier_batch_serves_a_plain_chat_in_the_batch_tier():
    engine = shared_engine()
    with running_server(lambda: engine, engine, default_tier="batch") as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        body = {"model": "gemma-3-270m-Q4_K_M", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
        answer = http.post("/v1/chat/completions", json=body).json()
        assert answer["service_tier"] == "flex" and _served(scrape(http), "batch") == 1
        answer = http.post("/v1/chat/completions", json={**body, "service_tier": "priority"}).json()
        assert answer["service_tier"] == "priority" and _served(scrape(http), "interactive") == 1
