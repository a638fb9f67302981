"""An output format beside callable tools, against a real `cobatch serve`, on all three routes
(chat's response_format, Responses' text.format, Messages' output_config.format): under auto
every answer is complete valid calls or a document valid against the format, streamed or not;
under required the format does not apply; refusals name the format's field."""
from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server_fixtures import serve_process, wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                            "parameters": PARAMETERS}}
FORECAST = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                             "sky": {"type": "string", "maxLength": 30}},
            "required": ["city", "sky"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": FORECAST}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# Greedy, without drafts, flash attention off (the server's flag): an answer depends on its prompt alone.
SAME_EVERY_TIME = {"temperature": 0, "speculative": False}


class Forecast(BaseModel):
    city: str = Field(max_length=30)
    sky: str = Field(max_length=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_process("--n-ctx", "4096", "--flash-attn", "off",
                       "--data-dir", str(tmp_path_factory.mktemp("format-data"))) as (_, url):
        yield url


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=300) as c:
        yield c


def chat(http, **body) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "tools": [WEATHER],
                                                   "response_format": RESPONSE_FORMAT, "max_tokens": 60, **body})


def needs(http, **body) -> int:
    """The fewest tokens the server asks for, read from its refusal of max_tokens 1."""
    error = chat(http, **body, max_tokens=1).json()["error"]
    assert error["param"] == "max_tokens", error
    return int(error["message"].split("needs ")[1].split()[0])


@pytest.fixture(scope="module")
def budgets(http) -> tuple[int, int]:
    """(the shortest answer under auto: a call or a forecast; the shortest call)."""
    return needs(http), needs(http, tool_choice="required")


def call_bias(http) -> dict[str, int]:
    """A logit_bias towards the calls document's opening (both alternatives begin with `{"`)."""
    return {str(t): 30 for t in http.post("/tokenize", json={"content": '{"tool_calls":['}).json()["tokens"]}


def read_choice(choice: dict) -> str:
    """'calls' or 'format', after checking the answer is exactly one of them, complete and valid."""
    message = choice["message"]
    if choice["finish_reason"] == "tool_calls":
        assert message["content"] is None and message["tool_calls"]
        for call in message["tool_calls"]:
            assert call["function"]["name"] == "get_weather"
            jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS)
        return "calls"
    assert choice["finish_reason"] == "stop" and "tool_calls" not in message, choice
    jsonschema.validate(json.loads(message["content"]), FORECAST)
    return "format"


# ---------------------------------------------------------------- chat completions
def test_auto_answers_are_complete_calls_or_a_valid_document_at_every_budget(http, budgets):
    shortest, call = budgets
    assert shortest < call  # a forecast fits where no call does
    seen = []
    for seed in range(4):
        for max_tokens in (shortest, call - 1, call, call + 40):
            for bias in ({}, call_bias(http)):
                r = chat(http, max_tokens=max_tokens, seed=seed, temperature=1.0, logit_bias=bias)
                assert r.status_code == 200, r.text
                kind = read_choice(r.json()["choices"][0])
                if max_tokens < call:
                    assert kind == "format"  # a call could not be finished in time, so none began
                seen.append(kind)
    assert {"calls", "format"} <= set(seen)


def test_required_calls_whatever_the_format(http, budgets):
    for seed in range(2):
        choice = chat(http, tool_choice="required", seed=seed, temperature=1.0).json()["choices"][0]
        assert read_choice(choice) == "calls"


def streamed_chat(http, **body) -> tuple[str | None, list, str]:
    content, calls, finish = None, {}, None
    with http.stream("POST", "/v1/chat/completions", json={
            "model": MODEL, "messages": ASK, "tools": [WEATHER], "response_format": RESPONSE_FORMAT,
            "max_tokens": 60, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta, finish = choice["delta"], choice["finish_reason"] or finish
            if delta.get("content"):
                content = (content or "") + delta["content"]
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"name": None, "arguments": ""})
                call["name"] = piece["function"].get("name") or call["name"]
                call["arguments"] += piece["function"]["arguments"]
    return content, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], finish


@pytest.mark.parametrize("kind", ["calls", "format"])
def test_the_stream_joins_into_the_whole_answer(http, budgets, kind):
    body = {**SAME_EVERY_TIME, "max_tokens": budgets[1] + 20 if kind == "calls" else budgets[1] - 1,
            "logit_bias": call_bias(http)}
    chat(http, **body)  # the prompt in the prefix cache: the two compared below run the same steps
    whole = chat(http, **body).json()["choices"][0]
    assert read_choice(whole) == kind
    content, calls, finish = streamed_chat(http, **body)
    assert finish == whole["finish_reason"]
    assert content == whole["message"]["content"]
    assert calls == [(c["function"]["name"], c["function"]["arguments"])
                     for c in whole["message"].get("tool_calls") or []]


# ---------------------------------------------------------------- Responses and Messages, through their SDKs
def test_responses_parse_reads_the_format_or_returns_the_call(server, budgets):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)
    tool = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
            "parameters": PARAMETERS}
    ask = dict(model=MODEL, input="What is the weather in Paris?", tools=[tool], text_format=Forecast,
               temperature=0)
    answer = client.responses.parse(**ask, max_output_tokens=budgets[1] - 1)  # too short for a call
    assert answer.status == "completed" and isinstance(answer.output_parsed, Forecast)
    assert answer.text.format.type == "json_schema" and answer.tool_choice == "auto"
    called = client.responses.parse(**ask, max_output_tokens=budgets[1] + 20)
    calls = [o for o in called.output if o.type == "function_call"]
    assert called.output_parsed is None and calls and all(c.name == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), PARAMETERS)
    with client.responses.stream(**ask, max_output_tokens=budgets[1] - 1,
                                 extra_body={"speculative": False}) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Forecast) and deltas == final.output_text


def test_messages_output_config_beside_tools(server, budgets):
    client = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0, timeout=300)
    tool = {"name": "get_weather", "description": "Current weather for a city", "input_schema": PARAMETERS}
    ask = dict(model=MODEL, messages=ASK, tools=[tool], extra_body={"temperature": 0, "speculative": False},
               output_config={"format": {"type": "json_schema", "schema": FORECAST}})
    answer = client.messages.create(**ask, max_tokens=budgets[1] - 1)
    assert answer.stop_reason == "end_turn" and [b.type for b in answer.content] == ["text"]
    jsonschema.validate(json.loads(answer.content[0].text), FORECAST)
    with client.messages.stream(**ask, max_tokens=budgets[1] - 1) as stream:
        assert "".join(stream.text_stream) == answer.content[0].text
    called = client.messages.create(**ask, max_tokens=budgets[1] + 20)
    assert called.stop_reason == "tool_use"  # the model opens a call when one fits (greedy, this prompt)
    for block in called.content:
        assert block.type == "tool_use" and block.name == "get_weather"
        jsonschema.validate(block.input, PARAMETERS)
    parsed = client.messages.parse(model=MODEL, messages=ASK, tools=[tool], output_format=Forecast,
                                   max_tokens=budgets[1] - 1, extra_body={"temperature": 0})
    assert isinstance(parsed.parsed_output, Forecast)


# ---------------------------------------------------------------- refusals
NOT_COMPILED = {"type": "object", "properties": {"city": {"not": {"type": "string"}}}}


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "max_tokens": 60, "response_format": {
        "type": "json_schema", "json_schema": {"name": "f", "schema": NOT_COMPILED}}}, "response_format"),
    ("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "max_tokens": 2,
                              "response_format": RESPONSE_FORMAT}, "max_tokens"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}],
                       "text": {"format": {"type": "json_schema", "name": "f", "schema": NOT_COMPILED}}}, "text.format"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}],
                       "max_output_tokens": 2, "text": {"format": {"type": "json_schema", "name": "f",
                                                                   "schema": FORECAST}}}, "max_output_tokens"),
    ("/v1/messages", {"messages": ASK, "max_tokens": 60, "tools": [{"name": "get_weather", "input_schema": PARAMETERS}],
                      "output_config": {"format": {"type": "json_schema", "schema": NOT_COMPILED}}},
     "output_config.format"),
])
def test_refusals_name_the_formats_field_and_leave_the_server_idle(http, path, body, param):
    r = http.post(path, json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path == "/v1/messages":
        assert param in error["message"] and "'not'" in error["message"]
    else:
        assert error["param"] == param, error
        assert ("needs" in error["message"]) if "max" in param else ("'not'" in error["message"])

    def idle():
        health = http.get("/health").json()
        return health["running"] == 0 and health["kv"]["cells_used"] == 0 and not any(health["queue"].values())

    wait_until(idle, 30, "the server did not return to idle")
