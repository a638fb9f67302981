"""Anthropic's Messages API without a model: the body's translation into the chat route's spec,
every refusal, the answer and its stream built from hand-made results, error shapes and keys."""
from __future__ import annotations

import asyncio
import json
import random

import pytest
from starlette.testclient import TestClient

from engine import FinishReason, GenerationResult
from engine.request import RequestMetrics
from server.anthropic_answers import MessageAnswer
from server.anthropic_schemas import parse_count_tokens_body, parse_messages_body
from server.app import create_app
from server.auth import KeyCheck
from server.chat_messages import ChatMessage, ToolCallRecord
from server.context import ServerSettings
from server.error_shapes import anthropic_error_body, error_response, speaks_anthropic
from server.errors import BadRequest, GatewayTimeout, NotFound, ServiceUnavailable, TooManyRequests
from server.openai_schemas import parse_chat
from server.tools import calls_text

WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ADD = {"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
BASE = {"model": "m", "max_tokens": 32, "messages": ASK}


def parse(**fields):
    return parse_messages_body({**BASE, **fields}, n_ctx=4096)


def turn_with_a_call(result_block: dict) -> list[dict]:
    return ASK + [
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris", "days": [1, 2]}}]},
        {"role": "user", "content": [result_block, {"type": "text", "text": "And tomorrow?"}]},
    ]


# ---------------------------------------------------------------- the body → the chat spec
def test_every_field_maps_to_the_chat_spec_it_stands_for():
    body = {**BASE, "system": [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Be kind.",
                                                                           "cache_control": {"type": "ephemeral"}}],
            "messages": turn_with_a_call({"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "sunny"}]}),
            "stop_sequences": ["\n\n", "END"], "temperature": 0.5, "top_p": 0.9, "top_k": 40,
            "metadata": {"user_id": "u-1"}, "stream": True, "seed": 7, "speculative": False,
            "service_tier": "standard_only", "cache_control": {"type": "ephemeral"}}
    spec = parse_messages_body(body, n_ctx=4096).spec
    assert spec.prompt.messages == (
        ChatMessage("system", "Be brief. Be kind."),
        ChatMessage("user", "What is the weather in Paris?"),
        ChatMessage("assistant", "Let me look.", (ToolCallRecord("toolu_1", "get_weather",
                                                                 '{"city":"Paris","days":[1,2]}'),)),
        ChatMessage("tool", "sunny", tool_call_id="toolu_1"),
        ChatMessage("user", "And tomorrow?"),
    )
    assert (spec.max_tokens, spec.stop, spec.temperature, spec.top_p, spec.top_k) == (32, ("\n\n", "END"), 0.5, 0.9, 40)
    assert spec.stream and spec.seed == 7 and not spec.speculative and spec.tools is None
    assert spec.priority == "interactive"


def test_the_spec_is_the_one_the_chat_route_builds_from_the_same_conversation():
    anthropic = parse(system="Be brief.", temperature=0.2, tools=[WEATHER], tool_choice={"type": "any"}).spec
    chat = parse_chat({"model": "m", "max_tokens": 32, "temperature": 0.2, "tool_choice": "required",
                       "messages": [{"role": "system", "content": "Be brief."}] + ASK,
                       "tools": [{"type": "function", "function": {"name": "get_weather",
                                                                   "description": WEATHER["description"],
                                                                   "parameters": WEATHER["input_schema"]}}]},
                      n_ctx=4096).specs[0]
    assert anthropic == chat


def test_an_errored_tool_result_says_so_and_string_content_is_taken_whole():
    spec = parse(messages=turn_with_a_call({"type": "tool_result", "tool_use_id": "toolu_1", "content": "timeout",
                                            "is_error": True})).spec
    assert spec.prompt.messages[2] == ChatMessage("tool", "Error: timeout", tool_call_id="toolu_1")
    empty = parse(messages=turn_with_a_call({"type": "tool_result", "tool_use_id": "toolu_1"})).spec
    assert empty.prompt.messages[2].content == ""


@pytest.mark.parametrize("choice, expected", [
    (None, ("auto", None, True)),
    ({"type": "auto"}, ("auto", None, True)),
    ({"type": "any"}, ("required", None, True)),
    ({"type": "tool", "name": "add"}, ("named", "add", True)),
    ({"type": "none"}, ("none", None, True)),
    ({"type": "any", "disable_parallel_tool_use": True}, ("required", None, False)),
    ({"type": "auto", "disable_parallel_tool_use": False}, ("auto", None, True)),
])
def test_tool_choice_maps_to_the_chat_choices(choice, expected):
    fields = {"tools": [WEATHER, ADD]} | ({} if choice is None else {"tool_choice": choice})
    tools = parse(**fields).spec.tools
    assert (tools.choice, tools.named, tools.parallel) == expected
    assert [f.name for f in tools.functions] == ["get_weather", "add"]
    assert tools.functions[0].parameters == WEATHER["input_schema"]
    if expected[2] is False or expected[0] == "named":
        assert tools.max_calls == 1


@pytest.mark.parametrize("fields, tier", [
    ({}, "interactive"), ({"service_tier": "auto"}, "interactive"), ({"service_tier": "standard_only"}, "interactive"),
    ({"priority": "batch"}, "batch"), ({"priority": "batch", "service_tier": "auto"}, "batch"),
])
def test_the_tier_is_the_routes_unless_cobatchs_priority_names_one(fields, tier):
    assert parse(**fields).spec.priority == tier
    assert parse_messages_body({**BASE, **fields}, n_ctx=4096, tier="batch").spec.priority == (
        fields.get("priority", "batch"))


FORECAST = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_output_config_format_is_the_chat_response_format_and_beside_tools_what_an_answer_follows():
    alone = parse(output_config={"format": {"type": "json_schema", "schema": FORECAST}, "effort": None}).spec
    assert alone.structured.source == "response_format" and dict(alone.structured.schema) == FORECAST
    beside = parse(tools=[WEATHER], output_config={"format": {"type": "json_schema", "schema": FORECAST}}).spec
    assert beside.structured.source == "tools" and dict(beside.answer_format.schema) == FORECAST
    forced = parse(tools=[WEATHER], tool_choice={"type": "any"},
                   output_config={"format": {"type": "json_schema", "schema": FORECAST}}).spec
    assert forced.answer_format is None  # "any" always calls: the format does not apply to this turn
    assert parse(output_config={}).spec.structured is None
    counted = parse_count_tokens_body({"model": "m", "messages": ASK, "output_config": {
        "format": {"type": "json_schema", "schema": FORECAST}}}, n_ctx=4096)
    assert counted.spec.structured is None  # counting reads the prompt only


def test_count_tokens_reads_what_shapes_the_prompt_only():
    counted = parse_count_tokens_body({"model": "m", "messages": ASK, "system": "Be brief.", "tools": [WEATHER],
                                       "tool_choice": {"type": "any"}}, n_ctx=4096).spec
    created = parse(system="Be brief.", tools=[WEATHER], tool_choice={"type": "any"}).spec
    assert (counted.prompt, counted.tools) == (created.prompt, created.tools)
    with pytest.raises(BadRequest) as err:
        parse_count_tokens_body({"model": "m", "messages": ASK, "max_tokens": 5}, n_ctx=4096)
    assert err.value.param == "max_tokens" and "unknown field" in err.value.message


REFUSED = [
    ({"output_config": {"effort": "high"}}, "output_config.effort", "effort"),
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type", "json_schema"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}},
     "output_config.format.schema", "not a valid JSON Schema"),
    ({"output_config": "json"}, "output_config", "object"),
    ({"max_tokens": None}, "max_tokens", "required"),
    ({"max_tokens": "many"}, "max_tokens", "integer"),
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"max_tokens": 5000}, "max_tokens", "<= 4096"),
    ({"model": 3}, "model", "string"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": "hi"}, "messages", "non-empty"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "'user', 'assistant'"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name", "unknown"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "non-empty"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type",
     "text only"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages[0].content[0].type", "text only"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type",
     "not a block this server reads"),
    ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0]", "'type'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages[0].content[0].text",
     "string"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": [{"a": 1}]}]}]},
     "messages[0].content[0].citations", "cite"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]},
     "messages[0].content[0].tool_use_id", "names no tool_use"),
    ({"messages": turn_with_a_call({"type": "tool_result", "tool_use_id": "toolu_2", "content": "1"})},
     "messages[2].content[0].tool_use_id", "names no tool_use"),
    ({"messages": turn_with_a_call({"type": "tool_result", "tool_use_id": "toolu_1",
                                    "content": [{"type": "image", "source": {}}]})},
     "messages[2].content[0].content[0]", "text only"),
    ({"messages": turn_with_a_call({"type": "tool_result", "tool_use_id": "toolu_1", "content": 5})},
     "messages[2].content[0].content", "string"),
    ({"messages": ASK + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                            "input": "x"}]}, *ASK]},
     "messages[1].content[0].input", "object"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type", "other role"),
    ({"messages": ASK + [{"role": "assistant", "content": "The weather is"}]}, "messages[1]", "prefill"),
    ({"messages": ASK + [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}, *ASK]},
     "messages[1].content[0].type", "thinking"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking", "thinking"),
    ({"system": 5}, "system", "string"),
    ({"system": [{"type": "image"}]}, "system[0]", "text"),
    ({"stop_sequences": "END"}, "stop_sequences", "list"),
    ({"stop_sequences": [""]}, "stop_sequences", "'stop_sequences[0]' must not be empty"),
    ({"temperature": 1.5}, "temperature", "<= 1.0"),
    ({"top_p": 0}, "top_p", "greater than"),
    ({"top_k": -1}, "top_k", ">= 0"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"metadata": "u-1"}, "metadata", "object"),
    ({"cache_control": "ephemeral"}, "cache_control", "object"),
    ({"speed": "fast"}, "speed", "unknown"),
    ({"service_tier": "priority"}, "service_tier", "'auto', 'standard_only'"),
    ({"n": 2}, "n", "unknown"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type", "server tool"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "required"),
    ({"tools": [{"name": "f g", "input_schema": {"type": "object"}}]}, "tools[0].name", "letters"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools[0].input_schema", "object"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}, "color": 1}]}, "tools[0].color", "unknown"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name", "twice"),
    ({"tools": {"name": "f"}}, "tools", "list"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice", "object"),
    ({"tools": [WEATHER], "tool_choice": {"type": "required"}}, "tool_choice.type", "'auto', 'any'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name", "required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "add"}}, "tool_choice", "does not declare"),
    ({"tools": [WEATHER], "tool_choice": {"type": "none", "disable_parallel_tool_use": True}},
     "tool_choice.disable_parallel_tool_use", "unknown"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER], "stop_sequences": ["END"]}, "stop_sequences", "'stop_sequences' cannot be combined"),
    ({"priority": "urgent"}, "priority", "'interactive', 'batch'"),
]


@pytest.mark.parametrize("fields, param, words", REFUSED, ids=[f"{i}-{r[1]}" for i, r in enumerate(REFUSED)])
def test_each_refusal_is_a_400_naming_the_field_in_anthropics_terms(fields, param, words):
    body = {**BASE, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(BadRequest) as err:
        parse_messages_body(body, n_ctx=4096)
    assert err.value.status_code == 400
    assert err.value.param == param, err.value.message
    assert words in err.value.message
    assert ".function" not in err.value.message and "'stop'" not in err.value.message  # no chat-route field names


def test_accepted_forms_that_ask_for_nothing():
    spec = parse(thinking={"type": "disabled"}, metadata=None, stop_sequences=None,
                 messages=[{"role": "user", "content": [{"type": "text", "text": "Hi", "citations": None}]}]).spec
    assert spec.prompt.messages == (ChatMessage("user", "Hi"),) and spec.stop == ()


# ---------------------------------------------------------------- the answer and its stream
def result(text: str, reason: FinishReason = FinishReason.STOP, *, stop: str | None = None, prompt: int = 40,
           cached: int = 0, generated: int = 9) -> GenerationResult:
    metrics = RequestMetrics(prompt_tokens=prompt, tokens_generated=generated, queue_time_ms=0.0, ttft_ms=1.0,
                             generation_time_ms=1.0, latency_ms=1.0, tokens_per_second=1.0, cached_tokens=cached)
    return GenerationResult("msg_x", text, (), reason, metrics, stop_string=stop)


class FakeHandle:
    """Streams the given pieces, then the result, as a RequestHandle does to asyncio."""

    def __init__(self, pieces: list[str], final: GenerationResult) -> None:
        self.pieces, self.final = pieces, final

    async def _deltas(self):
        for piece in self.pieces:
            yield piece

    def __aiter__(self):
        return self._deltas()

    def __await__(self):
        async def done():
            return self.final
        return done().__await__()

    def done(self) -> bool:
        return True


def events_of(answer: MessageAnswer, pieces: list[str], final: GenerationResult) -> list[tuple[str, dict]]:
    async def collect() -> list[bytes]:
        return [chunk async for chunk in answer.stream([FakeHandle(pieces, final)])]

    events = []
    for chunk in asyncio.run(collect()):
        name, data = chunk.decode().strip().split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[6:])
        assert payload["type"] == name[7:]
        events.append((name[7:], payload))
    return events


def joined(events: list[tuple[str, dict]]) -> dict:
    """A stream's events folded into the message they describe."""
    message = None
    partial: dict[int, str] = {}
    for name, event in events:
        if name == "message_start":
            message = event["message"]
        elif name == "content_block_start":
            assert event["index"] == len(message["content"])
            message["content"].append(dict(event["content_block"]))
        elif name == "content_block_delta":
            delta, block = event["delta"], message["content"][event["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif name == "content_block_stop" and event["index"] in partial:
            message["content"][event["index"]]["input"] = json.loads(partial[event["index"]])
        elif name == "message_delta":
            message.update(event["delta"])
            message["usage"] = event["usage"]
    return message


def split(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def test_a_text_answer_and_its_usage_split_between_cache_and_input():
    answer = MessageAnswer("msg_1", "gemma", parse().spec, prompt_tokens=40)
    message = answer.response([result("Hello there.", cached=32)])
    assert message == {"id": "msg_1", "type": "message", "role": "assistant", "model": "gemma",
                       "content": [{"type": "text", "text": "Hello there."}], "stop_reason": "end_turn",
                       "stop_sequence": None,
                       "usage": {"input_tokens": 8, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 32,
                                 "output_tokens": 9, "service_tier": "priority"}}


@pytest.mark.parametrize("final, reason, sequence", [
    (result("Hi", FinishReason.LENGTH), "max_tokens", None),
    (result("Hi", FinishReason.CONTEXT_LENGTH), "model_context_window_exceeded", None),
    (result("Hi", stop="END"), "stop_sequence", "END"),
    (result("Hi", stop="\nuser:"), "end_turn", None),  # a chat format's own stop is not the client's
])
def test_stop_reasons(final, reason, sequence):
    message = MessageAnswer("msg_1", "m", parse(stop_sequences=["END"]).spec, 40).response([final])
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


CALLS = calls_text([("get_weather", '{"city":"Paris"}'), ("add", '{"a":2}')])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("case", ["text", "calls", "stop"])
def test_the_streamed_events_join_into_the_whole_message(case, seed):
    fields, text, final = {}, "The sky is clear over Paris today.", result("The sky is clear over Paris today.")
    if case == "calls":
        fields, text, final = {"tools": [WEATHER, ADD], "tool_choice": {"type": "any"}}, CALLS, result(CALLS)
    elif case == "stop":
        fields, final = {"stop_sequences": ["END"]}, result(text, stop="END")
    spec = parse(**fields).spec
    whole = MessageAnswer("msg_1", "m", spec, 40).response([final])
    events = events_of(MessageAnswer("msg_1", "m", spec, 40), split(text, seed), final)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 40
    streamed = joined(events)
    for block, expected in zip(streamed["content"], whole["content"]):
        if block["type"] == "tool_use":
            assert block["id"].startswith("toolu_") and expected["id"].startswith("toolu_")
            block["id"] = expected["id"]
    assert streamed == whole
    if case == "calls":
        assert whole["stop_reason"] == "tool_use"
        assert [(b["type"], b["name"], b["input"]) for b in whole["content"]] == [
            ("tool_use", "get_weather", {"city": "Paris"}), ("tool_use", "add", {"a": 2})]
        assert names.count("content_block_start") == names.count("content_block_stop") == 2


def test_calls_cut_short_are_not_returned():
    spec = parse(tools=[WEATHER], tool_choice={"type": "any"}).spec
    cut = CALLS[:30]
    message = MessageAnswer("msg_1", "m", spec, 40).response([result(cut, FinishReason.LENGTH)])
    assert message["content"] == [] and message["stop_reason"] == "max_tokens"


def test_auto_answers_in_text_when_the_output_opens_no_call():
    spec = parse(tools=[WEATHER]).spec
    message = MessageAnswer("msg_1", "m", spec, 40).response([result("It is sunny.")])
    assert message["content"] == [{"type": "text", "text": "It is sunny."}] and message["stop_reason"] == "end_turn"


def test_an_empty_answer_has_no_blocks_streamed_or_not():
    spec = parse().spec
    assert MessageAnswer("m1", "m", spec, 40).response([result("")])["content"] == []
    events = events_of(MessageAnswer("m1", "m", spec, 40), [], result(""))
    assert [n for n, _ in events] == ["message_start", "ping", "message_delta", "message_stop"]


def test_a_request_that_fails_mid_stream_ends_with_an_error_event():
    events = events_of(MessageAnswer("m1", "m", parse().spec, 40), ["Hel"], result("Hel", FinishReason.CANCELLED))
    assert events[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": events[-1][1][
        "error"]["message"]}})
    assert "shutting down" in events[-1][1]["error"]["message"]
    assert "message_stop" not in [n for n, _ in events]


# ---------------------------------------------------------------- errors and keys
@pytest.mark.parametrize("error, kind", [
    (BadRequest("x"), "invalid_request_error"), (NotFound("x"), "not_found_error"),
    (TooManyRequests("x"), "rate_limit_error"), (ServiceUnavailable("x"), "overloaded_error"),
    (GatewayTimeout("x"), "timeout_error"),
])
def test_anthropic_error_bodies(error, kind):
    assert anthropic_error_body(error) == {"type": "error", "error": {"type": kind, "message": "x"}}


def test_the_error_shape_follows_the_route():
    assert speaks_anthropic({"path": "/v1/messages"}) and speaks_anthropic({"path": "/v1/messages/count_tokens"})
    assert speaks_anthropic({"path": "/api/v1/messages", "root_path": "/api"})
    assert not speaks_anthropic({"path": "/v1/messagesx"}) and not speaks_anthropic({"path": "/v1/chat/completions"})
    anthropic = json.loads(error_response(BadRequest("bad", param="x"), {"path": "/v1/messages"}).body)
    openai = json.loads(error_response(BadRequest("bad", param="x"), {"path": "/v1/completions"}).body)
    assert anthropic == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert openai["error"]["param"] == "x"


def test_a_bare_key_names_the_same_caller_as_a_bearer_one():
    check = KeyCheck(["k1"])
    assert check.identify_key("k1") == check.identify("Bearer k1") and check.identify_key("k1") is not None
    for key in (None, "", " ", "k2", "Bearer k1"):
        assert check.identify_key(key) is None


def test_keys_and_route_errors_over_http_in_each_routes_shape():
    # No lifespan: the model never loads, so a request that passes the key check meets a 503.
    client = TestClient(create_app(lambda: None, ServerSettings(api_keys=("k1",))))
    ask = {**BASE, "model": "gemma"}
    for headers in ({}, {"x-api-key": "k2"}, {"Authorization": "Bearer k2"}):
        r = client.post("/v1/messages", json=ask, headers=headers)
        assert r.status_code == 401 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "authentication_error"
        assert client.get("/v1/models", headers=headers).json()["error"]["code"] == "invalid_api_key"
    for headers in ({"x-api-key": "k1", "anthropic-version": "2023-06-01", "anthropic-beta": "x"},
                    {"Authorization": "Bearer k1"}):
        r = client.post("/v1/messages", json=ask, headers=headers)
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        r = client.post("/v1/messages/count_tokens", json={"model": "gemma", "messages": ASK}, headers=headers)
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        assert client.get("/v1/models", headers=headers).json()["error"]["code"] == "loading"
    key = {"x-api-key": "k1"}
    assert client.post("/v1/messages", content=b"{", headers=key).json()["error"]["type"] == "invalid_request_error"
    r = client.get("/v1/messages", headers=key)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.post("/v1/messages/batches", json={}, headers=key)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
