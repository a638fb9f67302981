"""Anthropic's Messages API against a real `cobatch serve`, driven by the anthropic SDK: plain and
streamed answers (the stream joins into the whole answer), stop sequences, tool_use → tool_result
round trips whose inputs are valid against their schemas, the prefix cache on a second turn,
count_tokens against usage, refusals in Anthropic's error shape, and API keys sent as x-api-key."""
from __future__ import annotations

import json
import uuid

import anthropic
import httpx
import jsonschema
import pytest

from tests.server_fixtures import serve_process, wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                             "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}
ADD = {"name": "add", "description": "Add two integers",
       "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"]}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The anthropic SDK (2.x) has no sampling parameters of its own; temperature and cobatch's fields
# go in extra_body.
GREEDY = dict(extra_body={"temperature": 0})
# Greedy and without drafts: only then is an answer a function of its prompt alone, which the
# streamed-against-whole comparisons need (drafting depends on earlier outputs; the server runs
# without flash attention, whose sums depend on what else the cache holds).
SAME_EVERY_TIME = dict(extra_body={"temperature": 0, "speculative": False})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # A data directory of its own: the keys test's server runs beside this one.
    with serve_process("--n-ctx", "4096", "--flash-attn", "off",
                       "--data-dir", str(tmp_path_factory.mktemp("messages-data"))) as (_, url):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=300) as c:
        yield c


def stream_events(http: httpx.Client, body: dict) -> list[tuple[str, dict]]:
    """A streamed answer's (event name, data) pairs, read off the wire."""
    events, name = [], None
    with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append((name, data))
    return events


def check_tool_uses(message, allowed=None) -> list:
    """The message's tool_use blocks, each naming a declared tool with an input valid against its schema."""
    schemas = {t["name"]: t["input_schema"] for t in TOOLS}
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use"
    for use in uses:
        assert use.id.startswith("toolu_") and use.name in (allowed or schemas)
        assert isinstance(use.input, dict)
        jsonschema.validate(use.input, schemas[use.name], format_checker=jsonschema.FormatChecker())
    assert len({u.id for u in uses}) == len(uses)
    return uses


def idle(http: httpx.Client) -> bool:
    health = http.get("/health").json()
    return (health["status"] == "ok" and health["running"] == 0 and health["kv"]["cells_used"] == 0
            and not any(health["queue"].values()))


# ---------------------------------------------------------------- answers
def test_create_answers_a_message_in_anthropics_shape(client):
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=24, **GREEDY,
                                                   system="Answer in one short sentence.",
                                                   messages=[{"role": "user", "content": "Say hello."}])
    message = raw.parse()
    assert raw.headers["x-request-id"] == message.id and message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    usage = message.usage
    assert 0 < usage.output_tokens <= 24 and usage.input_tokens > 0 and usage.cache_creation_input_tokens == 0
    assert usage.service_tier == "priority"  # a plain Messages request is a chat: the interactive tier


def test_the_stream_joins_into_the_whole_answer(client, http):
    ask = dict(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Tell me about the sea."}],
               **SAME_EVERY_TIME)
    client.messages.create(**ask)  # the prompt in the prefix cache: the two compared below run the same steps
    whole = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text and [b.type for b in final.content] == ["text"]
    assert final.content[0].text == text and final.id.startswith("msg_") and final.id != whole.id
    assert (final.stop_reason, final.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
    assert final.usage.output_tokens == whole.usage.output_tokens
    total = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == total
    # The events as Anthropic orders them, read off the wire.
    body = {k: v for k, v in ask.items() if k != "extra_body"} | ask["extra_body"]
    events = stream_events(http, body)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["usage"]["input_tokens"] == total
    assert "".join(e["delta"]["text"] for n, e in events if n == "content_block_delta") == text
    assert events[-2][1]["usage"]["output_tokens"] == whole.usage.output_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(client, http):
    stops = [" ", "e", "\n"]  # some of them begins any answer long enough
    ask = dict(model=MODEL, max_tokens=40, stop_sequences=stops,
               messages=[{"role": "user", "content": "Describe a sunny day at the beach."}], **SAME_EVERY_TIME)
    message = client.messages.create(**ask)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence in stops
    text = "".join(b.text for b in message.content)
    assert not any(s in text for s in stops)
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", message.stop_sequence)


def test_max_tokens_ends_with_stop_reason_max_tokens(client):
    message = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content":
                                                                           "Write a long story about a dragon."}])
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


# ---------------------------------------------------------------- tools
@pytest.mark.parametrize("tool_choice, allowed", [({"type": "any"}, None),
                                                  ({"type": "tool", "name": "add"}, ["add"])])
def test_tool_use_then_tool_result_round_trip_reads_the_first_turn_from_the_cache(client, tool_choice, allowed):
    first = client.messages.create(model=MODEL, max_tokens=80, messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                   **GREEDY)
    uses = check_tool_uses(first, allowed)
    if allowed:
        assert len(uses) == 1
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": json.dumps({"ok": True, "input": u.input})}
               for u in uses]
    # The SDK's own content blocks go back as they came.
    messages = ASK + [{"role": "assistant", "content": first.content}, {"role": "user", "content": results}]
    second = client.messages.create(model=MODEL, max_tokens=20, messages=messages, tools=TOOLS, **GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    if second.stop_reason == "tool_use":
        check_tool_uses(second)
    first_prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    second_prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert second_prompt > first_prompt
    # Turn 2 begins with turn 1's prompt, rendered identically: the cache serves all of it but
    # its last partial block (16 tokens).
    assert second.usage.cache_read_input_tokens >= first_prompt - 16 > 0
    counted = client.messages.count_tokens(model=MODEL, messages=messages, tools=TOOLS).input_tokens
    assert counted == second_prompt


def test_disable_parallel_tool_use_allows_one_call(client):
    for seed in range(3):
        message = client.messages.create(model=MODEL, max_tokens=80, messages=ASK, tools=TOOLS,
                                          tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                          extra_body={"seed": seed, "temperature": 1.0})
        assert len(check_tool_uses(message)) == 1


def test_streamed_tool_use_joins_into_the_whole_answer(client, http):
    ask = dict(model=MODEL, max_tokens=80, messages=ASK, tools=TOOLS, tool_choice={"type": "any"}, **SAME_EVERY_TIME)
    client.messages.create(**ask)
    whole = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    check_tool_uses(final)
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in check_tool_uses(whole)]
    body = {k: v for k, v in ask.items() if k != "extra_body"} | ask["extra_body"]
    events = stream_events(http, body)
    starts = [e["content_block"] for n, e in events if n == "content_block_start"]
    assert all(s["type"] == "tool_use" and s["input"] == {} and s["id"].startswith("toolu_") for s in starts)
    for i, block in enumerate(final.content):
        pieces = [e["delta"]["partial_json"] for n, e in events if n == "content_block_delta" and e["index"] == i]
        assert json.loads("".join(pieces)) == block.input
    assert [n for n, _ in events][-2:] == ["message_delta", "message_stop"]
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


# ---------------------------------------------------------------- usage and count_tokens
def test_count_tokens_equals_input_tokens_and_a_repeat_reads_the_cache(client):
    # A prompt no earlier request began with: nothing of it is cached the first time.
    ask = dict(model=MODEL, system=f"Session {uuid.uuid4().hex}. Be brief.", tools=[WEATHER],
               messages=[{"role": "user", "content": "Name three colours of the rainbow, please."}])
    counted = client.messages.count_tokens(**ask).input_tokens
    first = client.messages.create(**ask, max_tokens=8, **GREEDY)
    assert first.usage.input_tokens == counted and first.usage.cache_read_input_tokens == 0
    again = client.messages.create(**ask, max_tokens=8, **GREEDY)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == counted
    assert client.messages.count_tokens(model=MODEL, messages=ask["messages"]).input_tokens < counted  # tools count


# ---------------------------------------------------------------- refusals
def test_the_sdk_raises_its_own_errors(client):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert err.value.status_code == 400
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0].type" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="not-served-here", max_tokens=16, messages=ASK)
    assert err.value.body["error"]["type"] == "not_found_error" and MODEL in err.value.body["error"]["message"]


UNKNOWN_IMPOSSIBLE = {"name": "f", "input_schema": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}}
MALFORMED = [
    ("max_tokens missing", {"max_tokens": None}, 400, "max_tokens"),
    ("max_tokens a string", {"max_tokens": "ten"}, 400, "max_tokens"),
    ("messages a string", {"messages": "hi"}, 400, "messages"),
    ("empty messages", {"messages": []}, 400, "messages"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("unknown block type", {"messages": [{"role": "user", "content": [{"type": "audio", "data": "x"}]}]}, 400,
     "messages[0].content[0].type"),
    ("image block", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}, 400, "text only"),
    ("tool_result for an unknown id", {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "1"}]}]}, 400, "toolu_nope"),
    ("thinking", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "thinking"),
    ("server tool", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tools[0].type"),
    ("bad tool_choice", {"tools": TOOLS, "tool_choice": {"type": "required"}}, 400, "tool_choice.type"),
    ("tool_choice names no tool", {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, 400, "nope"),
    ("temperature above 1", {"temperature": 1.5}, 400, "temperature"),
    ("stop_sequences a string", {"stop_sequences": "END"}, 400, "stop_sequences"),
    ("unknown field", {"frequency": 3}, 400, "frequency"),
    ("prefill", {"messages": ASK + [{"role": "assistant", "content": "It is"}]}, 400, "prefill"),
    # Refused by the engine at submit, in the request's own (Anthropic) field names:
    ("a call cannot fit max_tokens", {"tools": TOOLS, "tool_choice": {"type": "any"}, "max_tokens": 3}, 400,
     "max_tokens=3"),
    ("a schema the grammar cannot compile", {"tools": [ADD, UNKNOWN_IMPOSSIBLE], "tool_choice": {"type": "any"}},
     400, "'tools[1].input_schema'"),
    ("model not served", {"model": "claude-opus-4-1"}, 404, "claude-opus-4-1"),
]


@pytest.mark.parametrize("body, status, words", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests_are_4xx_in_anthropics_shape_and_leave_the_server_idle(http, body, status, words):
    full = {k: v for k, v in ({"model": MODEL, "max_tokens": 16, "messages": ASK} | body).items() if v is not None}
    for stream in (False, True):
        r = http.post("/v1/messages", json=full | {"stream": stream})
        assert r.status_code == status, r.text
        error = r.json()
        assert set(error) == {"type", "error"} and error["type"] == "error"
        assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        assert words in error["error"]["message"], error
    wait_until(lambda: idle(http), 30, "the server did not return to idle")


def test_malformed_count_tokens_and_wrong_routes_answer_in_anthropics_shape(http):
    for body in ({"model": MODEL}, {"model": MODEL, "messages": ASK, "max_tokens": 5}, {"messages": ASK}):
        r = http.post("/v1/messages/count_tokens", json=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = http.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert http.get("/v1/messages").json()["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/messages/batches", json={}).json()["error"]["type"] == "not_found_error"
    assert "param" in http.post("/v1/chat/completions", json={"model": MODEL}).json()["error"]  # OpenAI's shape there
    assert idle(http)


# ---------------------------------------------------------------- keys
def test_a_server_with_keys_takes_x_api_key_and_refuses_a_wrong_key_in_anthropics_shape(tmp_path):
    with serve_process("--api-key", "k1", "--n-ctx", "1024", "--data-dir", str(tmp_path)) as (_, url):
        right = anthropic.Anthropic(base_url=url, api_key="k1", max_retries=0, timeout=120)
        message = right.messages.create(model=MODEL, max_tokens=4, messages=ASK)
        assert message.type == "message" and message.usage.output_tokens > 0
        assert right.messages.count_tokens(model=MODEL, messages=ASK).input_tokens > 0
        wrong = anthropic.Anthropic(base_url=url, api_key="k2", max_retries=0, timeout=120)
        with pytest.raises(anthropic.AuthenticationError) as err:
            wrong.messages.create(model=MODEL, max_tokens=4, messages=ASK)
        assert err.value.status_code == 401
        assert err.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                             "message": "the API key is not valid"}}
        ask = {"model": MODEL, "max_tokens": 2, "messages": ASK}
        missing = httpx.post(f"{url}/v1/messages", json=ask, timeout=60)
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        bearer = httpx.post(f"{url}/v1/messages", json=ask, headers={"Authorization": "Bearer k1"}, timeout=60)
        assert bearer.status_code == 200 and bearer.json()["type"] == "message"
        # Every route takes either header; the OpenAI routes keep OpenAI's error shape.
        assert httpx.get(f"{url}/v1/models", headers={"x-api-key": "k1"}, timeout=60).status_code == 200
        refused = httpx.get(f"{url}/v1/models", headers={"x-api-key": "k2"}, timeout=60)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
