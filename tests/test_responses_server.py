"""OpenAI's Responses API against a real `cobatch serve`, driven by the openai SDK: a plain
response and its usage, a stream that joins into the whole response, a function_call →
function_call_output round trip whose second turn reads the first from the prefix cache,
text.format json_schema parsed into a pydantic model, service_tier echoed, and refusals in
OpenAI's error shape."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server_fixtures import serve_process, wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                          "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}
ADD = {"type": "function", "name": "add", "description": "Add two integers",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}
TOOLS = [WEATHER, ADD]
ASK = "What is the weather in Paris?"
# Greedy and without drafts: only then is an answer a function of its prompt alone, which the
# streamed-against-whole comparison needs (the server runs without flash attention too).
SAME_EVERY_TIME = dict(temperature=0, extra_body={"speculative": False})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_process("--n-ctx", "4096", "--flash-attn", "off",
                       "--data-dir", str(tmp_path_factory.mktemp("responses-data"))) as (_, url):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=300) as c:
        yield c


def idle(http: httpx.Client) -> bool:
    health = http.get("/health").json()
    return (health["status"] == "ok" and health["running"] == 0 and health["kv"]["cells_used"] == 0
            and not any(health["queue"].values()))


def check_calls(response, allowed=None) -> list:
    """The response's function_call items, each naming a declared tool with arguments valid against it."""
    schemas = {t["name"]: t["parameters"] for t in TOOLS}
    calls = [o for o in response.output if o.type == "function_call"]
    assert calls and len(calls) == len(response.output) and response.status == "completed"
    for call in calls:
        assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"
        assert call.name in (allowed or schemas)
        jsonschema.validate(json.loads(call.arguments), schemas[call.name], format_checker=jsonschema.FormatChecker())
    return calls


# ---------------------------------------------------------------- answers
def test_create_answers_a_response_with_text_and_usage(client):
    raw = client.responses.with_raw_response.create(model=MODEL, instructions="Answer in one short sentence.",
                                                    input="Say hello.", max_output_tokens=24, temperature=0)
    response = raw.parse()
    assert raw.headers["x-request-id"] == response.id and response.id.startswith("resp_")
    assert (response.object, response.model, response.store) == ("response", MODEL, True)  # a data dir: stored
    assert response.output_text and response.status in ("completed", "incomplete")
    assert response.instructions == "Answer in one short sentence." and response.max_output_tokens == 24
    usage = response.usage
    assert 0 < usage.output_tokens <= 24 and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.service_tier == "priority"  # a plain Responses request is a chat: the interactive tier


def test_the_stream_joins_into_the_whole_response(client):
    ask = dict(model=MODEL, input="Tell me about the sea.", max_output_tokens=40, **SAME_EVERY_TIME)
    client.responses.create(**ask)  # the prompt in the prefix cache: the two compared below run the same steps
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text and events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # The SDK's own accumulator agrees (its get_final_response() wants response.completed only: an
    # answer cut at max_output_tokens ends with response.incomplete, read here as the last event).
    with client.responses.stream(**ask) as stream:
        last = list(stream)[-1]
    assert last.type == f"response.{whole.status}" and last.response.id != whole.id
    assert last.response.output_text == text


# ---------------------------------------------------------------- tools
def test_function_call_round_trip_reads_the_first_turn_from_the_cache(client):
    first = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required",
                                    max_output_tokens=80, temperature=0)
    calls = check_calls(first)
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"ok": True})}
               for c in calls]
    # The SDK's own output items go back as they came.
    second = client.responses.create(model=MODEL, input=[{"role": "user", "content": ASK}, *first.output, *outputs],
                                     tools=TOOLS, max_output_tokens=20, temperature=0)
    assert second.status in ("completed", "incomplete")
    if any(o.type == "function_call" for o in second.output):
        check_calls(second)
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_a_named_tool_choice_calls_that_tool_once_and_streams_its_arguments(client):
    ask = dict(model=MODEL, input=ASK, tools=TOOLS, tool_choice={"type": "function", "name": "add"},
               max_output_tokens=80, **SAME_EVERY_TIME)
    whole = client.responses.create(**ask)
    (call,) = check_calls(whole, ["add"])
    events = list(client.responses.create(**ask, stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.type, i.name, i.arguments) for i in added] == [("function_call", "add", "")]
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == call.arguments and events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == arguments


# ---------------------------------------------------------------- text.format and service_tier
class City(BaseModel):
    name: str = Field(max_length=40)  # bounded: the JSON closes well within max_output_tokens
    country: str = Field(max_length=40)


def test_json_schema_output_parses_into_the_model(client):
    response = client.responses.parse(model=MODEL, input="Name a large city and its country.", text_format=City,
                                      max_output_tokens=100, temperature=0)
    assert response.status == "completed" and isinstance(response.output_parsed, City)
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize("tier", ["flex", "priority"])
def test_service_tier_is_echoed(client, tier):
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, service_tier=tier)
    assert response.service_tier == tier


# ---------------------------------------------------------------- refusals
def test_the_sdk_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="Hi", conversation="conv_abc")
    assert err.value.status_code == 400 and err.value.param == "conversation"
    with pytest.raises(openai.NotFoundError) as err:  # as OpenAI answers an id it does not know
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_abc")
    assert err.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="not-served-here", input="Hi")


MALFORMED = [
    ("input missing", {"input": None}, 400, "input"),
    ("previous_response_id unknown", {"previous_response_id": "resp_1"}, 404, "previous_response_id"),
    ("conversation", {"conversation": "conv_1"}, 400, "conversation"),
    ("background", {"background": True}, 400, "background"),
    ("web search", {"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ("image part", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x"}]}]},
     400, "input[0].content[0].type"),
    ("reasoning", {"reasoning": {"effort": "high"}}, 400, "reasoning"),
    ("include", {"include": ["reasoning.encrypted_content"]}, 400, "include"),
    ("truncation", {"truncation": "auto"}, 400, "truncation"),
    ("unknown item", {"input": [{"type": "reasoning", "summary": []}]}, 400, "input[0].type"),
    ("output for no call", {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, 400,
     "input[0].call_id"),
    ("max_output_tokens 0", {"max_output_tokens": 0}, 400, "max_output_tokens"),
    ("tool_choice names no tool", {"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, 400,
     "tool_choice"),
    ("unknown field", {"frequency": 3}, 400, "frequency"),
    # Refused by the engine at submit, in the Responses field names:
    ("a call cannot fit", {"tools": TOOLS, "tool_choice": "required", "max_output_tokens": 3}, 400,
     "max_output_tokens"),
    ("model not served", {"model": "gpt-5"}, 404, "model"),
]


@pytest.mark.parametrize("body, status, param", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests_are_4xx_in_openais_shape_and_leave_the_server_idle(http, body, status, param):
    full = {k: v for k, v in ({"model": MODEL, "input": ASK} | body).items() if v is not None}
    for stream in (False, True):
        r = http.post("/v1/responses", json=full | {"stream": stream})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == param, error
    wait_until(lambda: idle(http), 30, "the server did not return to idle")
