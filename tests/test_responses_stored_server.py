"""Stored responses against a real `cobatch serve` with API keys, driven by the openai SDK:
`store` by default, retrieve, input_items, input_tokens, previous_response_id continuing a
function-call turn from the prefix cache with the prompt the whole conversation renders to,
delete, one key's responses hidden from another, a continuation across a killed and restarted
server, and refusals that store nothing and leave the server idle."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import ResponseItem
from pydantic import TypeAdapter

from server.responses_store import DATABASE
from tests.server_fixtures import serve_process, shared_engine, running_server, wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"]}}
ASK = "What is the weather in Paris?"
INSTRUCTIONS = "You are a weather assistant."
ITEMS = TypeAdapter(list[ResponseItem])
BLOCK = 16  # the prefix cache keeps whole blocks of this many tokens (--block-size's default)
SERVE = ("--n-ctx", "4096", "--flash-attn", "off", "--api-key", "key-a", "--api-key", "key-b")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stored-responses")


@pytest.fixture(scope="module")
def server(data_dir):
    with serve_process(*SERVE, "--data-dir", str(data_dir)) as (_, url):
        yield url


def client_for(url: str, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(server):
    return client_for(server)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=300, headers={"Authorization": "Bearer key-a"}) as c:
        yield c


def stored_count(data_dir: Path) -> int:
    with sqlite3.connect(f"file:{data_dir / DATABASE}?mode=ro", uri=True) as db:
        return db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]


def idle(http: httpx.Client) -> bool:
    health = http.get("/health").json()
    return health["status"] == "ok" and health["running"] == 0 and not any(health["queue"].values())


def call_weather(client: openai.OpenAI, **extra):
    # One call, by the grammar: which greedy answer the model gives (one call or two) turns on
    # near-ties that move with the CPU's kernels (two calls on an AMD EPYC with repacked weights).
    first = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, tools=[WEATHER],
                                    tool_choice="required", parallel_tool_calls=False, max_output_tokens=60,
                                    temperature=0, **extra)
    (call,) = [o for o in first.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    return first, call


# ---------------------------------------------------------------- store, retrieve, input items
def test_a_response_is_stored_by_default_and_retrieved_as_it_was_answered(client, http):
    created = client.responses.create(model=MODEL, input=[{"role": "developer", "content": "Be brief."},
                                                          {"role": "user", "content": "Say hello."}],
                                      max_output_tokens=16, temperature=0)
    assert created.store is True and created.previous_response_id is None
    again = client.responses.retrieve(created.id)
    assert again.model_dump() == created.model_dump()
    raw = http.get(f"/v1/responses/{created.id}/input_items", params={"order": "asc"}).json()
    items = ITEMS.validate_python(raw["data"])
    assert [(i.role, i.content[0].text) for i in items] == [("developer", "Be brief."), ("user", "Say hello.")]
    assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (items[0].id, items[1].id, False)
    # The SDK's own pagination: newest first by default, one item a page.
    listed = list(client.responses.input_items.list(created.id, limit=1))
    assert [i.id for i in listed] == [items[1].id, items[0].id]


def test_store_false_keeps_nothing(client, data_dir):
    before = stored_count(data_dir)
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    assert response.store is False and stored_count(data_dir) == before
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


# ---------------------------------------------------------------- continuing
def test_previous_response_id_continues_a_call_from_the_prefix_cache(client):
    first, call = call_weather(client)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"sky": "clear"})}
    follow = dict(model=MODEL, instructions=INSTRUCTIONS, tools=[WEATHER], max_output_tokens=20, temperature=0)
    second = client.responses.create(**follow, input=[result], previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    # The first turn's prompt came from the cache (every whole block of it)...
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // BLOCK * BLOCK > 0
    # ...and the prompt is the one the whole conversation, sent again, renders to.
    whole = [{"role": "user", "content": ASK}, *first.output, result]
    counted = client.responses.input_tokens.count(model=MODEL, instructions=INSTRUCTIONS, tools=[WEATHER],
                                                  input=whole)
    assert counted.input_tokens == second.usage.input_tokens
    assert client.responses.input_tokens.count(instructions=INSTRUCTIONS, tools=[WEATHER], input=[result],
                                               previous_response_id=first.id).input_tokens == counted.input_tokens
    # input_items: the first turn's input and output, then the new item.
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1].id == call.id and items[1].arguments == call.arguments and items[2].call_id == call.call_id


def test_a_stream_is_stored_and_continued(client):
    events = list(client.responses.create(model=MODEL, instructions=INSTRUCTIONS, max_output_tokens=8,
                                          input="Name a colour the sky can have at sunset over the sea.",
                                          temperature=0, stream=True))
    final = events[-1].response
    assert final.store is True and client.responses.retrieve(final.id).output_text == final.output_text
    second = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="Another one.",
                                     previous_response_id=final.id, max_output_tokens=8, temperature=0)
    assert second.usage.input_tokens_details.cached_tokens >= final.usage.input_tokens // BLOCK * BLOCK > 0


# ---------------------------------------------------------------- delete and owners
def test_delete_removes_one_response_and_says_so_afterwards(client, http):
    kept = client.responses.create(model=MODEL, input="One.", max_output_tokens=4)
    doomed = client.responses.create(model=MODEL, input="Two.", max_output_tokens=4)
    assert http.delete(f"/v1/responses/{doomed.id}").json() == {"id": doomed.id, "object": "response",
                                                                "deleted": True}
    with pytest.raises(openai.NotFoundError, match="was deleted"):
        client.responses.retrieve(doomed.id)
    with pytest.raises(openai.NotFoundError, match="was deleted") as err:
        client.responses.create(model=MODEL, input="Three.", previous_response_id=doomed.id, max_output_tokens=4)
    assert err.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(doomed.id)
    assert client.responses.retrieve(kept.id).id == kept.id


def test_another_keys_responses_are_not_found(server, client):
    mine = client.responses.create(model=MODEL, input="Mine.", max_output_tokens=4)
    theirs = client_for(server, "key-b")
    for attempt in (lambda: theirs.responses.retrieve(mine.id), lambda: theirs.responses.delete(mine.id),
                    lambda: list(theirs.responses.input_items.list(mine.id)),
                    lambda: theirs.responses.create(model=MODEL, input="x", previous_response_id=mine.id)):
        with pytest.raises(openai.NotFoundError, match="is not stored here"):
            attempt()
    assert client.responses.retrieve(mine.id).id == mine.id


# ---------------------------------------------------------------- refusals
BAD = [
    ("POST", "/v1/responses", {"input": "x", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
    ("POST", "/v1/responses", {"input": "x", "previous_response_id": ""}, 400, "previous_response_id"),
    ("POST", "/v1/responses", {"input": "x", "previous_response_id": ["resp_1"]}, 400, "previous_response_id"),
    ("POST", "/v1/responses", {"input": "x", "conversation": "conv_1"}, 400, "conversation"),
    ("POST", "/v1/responses", {"input": "x", "store": "yes"}, 400, "store"),
    ("POST", "/v1/responses", {"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0].type"),
    ("POST", "/v1/responses/input_tokens", {"input": "x", "previous_response_id": "resp_unknown"}, 404,
     "previous_response_id"),
    ("POST", "/v1/responses/input_tokens", {"input": 3}, 400, "input"),
    ("POST", "/v1/responses/input_tokens", {"input": "x", "model": "gpt-5"}, 404, "model"),
    ("GET", "/v1/responses/resp_unknown", None, 404, "response_id"),
    ("DELETE", "/v1/responses/resp_unknown", None, 404, "response_id"),
    ("GET", "/v1/responses/resp_unknown/input_items", None, 404, "response_id"),
]


@pytest.mark.parametrize("method, path, body, status, param", BAD, ids=[f"{b[1]} {b[4]} {b[3]}" for b in BAD])
def test_bad_requests_are_4xx_in_openais_shape_and_store_nothing(http, data_dir, method, path, body, status, param):
    before = stored_count(data_dir)
    full = None if body is None else {"model": MODEL, **body}
    r = http.request(method, path, json=full)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert stored_count(data_dir) == before
    wait_until(lambda: idle(http), 30, "the server did not return to idle")


def test_bad_queries_on_a_stored_response_are_400s(client, http):
    stored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    for path, params, param in [("", {"stream": "true"}, "stream"), ("", {"include": "x"}, "include"),
                                ("/input_items", {"limit": "0"}, "limit"), ("/input_items", {"order": "up"}, "order"),
                                ("/input_items", {"after": "msg_nope"}, "after")]:
        r = http.get(f"/v1/responses/{stored.id}{path}", params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ---------------------------------------------------------------- a restart
def test_a_continuation_survives_a_killed_server(tmp_path):
    with serve_process(*SERVE, "--data-dir", str(tmp_path)) as (proc, url):
        first, call = call_weather(client_for(url))
        proc.kill()  # no shutdown at all: the response was committed before it was answered
    with serve_process(*SERVE, "--data-dir", str(tmp_path)) as (_, url):
        client = client_for(url)
        assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        second = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, tools=[WEATHER], input=[result],
                                         previous_response_id=first.id, max_output_tokens=16, temperature=0)
        assert second.usage.input_tokens > first.usage.input_tokens
        assert [i.type for i in client.responses.input_items.list(second.id, order="asc")] == [
            "message", "function_call", "function_call_output"]


# ---------------------------------------------------------------- no data directory
def test_without_a_data_directory_nothing_is_stored_and_asking_to_is_refused():
    engine = shared_engine()
    with running_server(lambda: engine, engine) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        ask = {"model": MODEL, "input": "Hi", "max_output_tokens": 4}
        assert http.post("/v1/responses", json=ask).json()["store"] is False
        for extra, param in [({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id")]:
            r = http.post("/v1/responses", json=ask | extra)
            assert r.status_code == 400 and r.json()["error"]["param"] == param and "data directory" in r.text
        r = http.get("/v1/responses/resp_1")
        assert r.status_code == 404 and "data directory" in r.text


# ---------------------------------------------------------------- a store that cannot write
def test_a_store_that_cannot_write_loses_no_response(tmp_path):
    """Answers go on while the disk is full; the responses are found meanwhile and written after."""
    from tests.store_faults import FaultyStore

    engine = shared_engine()
    with running_server(lambda: engine, engine, data_dir=tmp_path) as server, \
            httpx.Client(base_url=server.url, timeout=120) as http:
        keeper = server.ctx.responses
        real = keeper.store
        faulty = keeper.store = FaultyStore(real, {"outage": [0, 600], "error": "full"})
        first = http.post("/v1/responses", json={"model": MODEL, "input": "Say hi.", "max_output_tokens": 4}).json()
        assert first["store"] is True and http.get(f"/v1/responses/{first['id']}").json() == first
        second = http.post("/v1/responses", json={"model": MODEL, "input": "Again.", "max_output_tokens": 4,
                                                  "previous_response_id": first["id"]})
        assert second.status_code == 200 and second.json()["store"] is True
        assert stored_count(tmp_path) == 0 and keeper.health()["held"] == 2  # both are held
        shown = http.get("/health").json()["stored_responses"]
        assert shown["held"] == 2 and "cannot write" in shown["reason"]
        faulty.set_plan({})  # the disk has room again
        wait_until(lambda: keeper.health()["held"] == 0, 30, "the held responses were not written")
        assert stored_count(tmp_path) == 2 and http.get("/health").json()["stored_responses"]["held"] == 0
        keeper.store = real
    assert stored_count(tmp_path) == 2
