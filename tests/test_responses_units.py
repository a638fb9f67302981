"""OpenAI's Responses API without a model: the body's translation into the chat route's spec, every
refusal, the response and its event stream built from hand-made results, parsed by the openai
SDK's own types."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient

from engine import FinishReason
from server.app import create_app
from server.chat_messages import ChatMessage, ToolCallRecord
from server.context import ServerSettings
from server.errors import BadRequest
from server.openai_schemas import parse_chat
from server.responses_answers import ResponseAnswer
from server.responses_routes import RESPONSES
from server.responses_schemas import parse_responses_body
from server.tiers import route_default
from server.tools import calls_text
from tests.test_messages_units import FakeHandle, result, split

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
           "parameters": PARAMS}
ADD = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                                 "parameters": PARAMS}}
ASK = "What is the weather in Paris?"
BASE = {"model": "m", "input": ASK}
EVENTS = TypeAdapter(ResponseStreamEvent)


def parse(**fields):
    return parse_responses_body({**BASE, **fields}, n_ctx=4096)


def chat_spec(**fields):
    return parse_chat({"model": "m", **fields}, n_ctx=4096).specs[0]


def turn_with_a_call(output: dict | None = None) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}', "status": "completed"},
            output or {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "developer", "content": "Answer in one word."}]


# ---------------------------------------------------------------- the body → the chat spec
def test_a_responses_body_gives_the_spec_of_the_equivalent_chat_body():
    responses = parse(instructions="Be brief.", input=turn_with_a_call(), max_output_tokens=32, temperature=0.2,
                      top_p=0.9, seed=7, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                      user="u", metadata={"k": "v"}, prompt_cache_key="p", safety_identifier="s", store=False,
                      service_tier="flex", speculative=False, stream=True).spec
    chat = chat_spec(messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "system", "content": "Answer in one word."}],
        max_tokens=32, temperature=0.2, top_p=0.9, seed=7, tools=[CHAT_WEATHER], tool_choice="required",
        parallel_tool_calls=False, service_tier="flex", speculative=False, stream=True)
    assert responses == chat
    assert responses.prompt.messages[2] == ChatMessage("assistant", "Let me look.", (
        ToolCallRecord("call_1", "get_weather", '{"city": "Paris"}'),))
    assert responses.priority == "batch" and responses.max_tokens == 32 and not responses.speculative


def test_a_string_input_is_one_user_message_and_the_defaults_are_the_chat_routes():
    assert parse().spec == chat_spec(messages=[{"role": "user", "content": ASK}])
    assert route_default("auto", RESPONSES) == "interactive" and route_default("batch", RESPONSES) == "batch"
    assert parse(stop=["END"], top_k=5).spec == chat_spec(messages=[{"role": "user", "content": ASK}], stop=["END"],
                                                          top_k=5)
    assert parse(stop=["END"]).spec.stop == ("END",)
    assert parse().spec.priority == "interactive"
    assert parse_responses_body(BASE, n_ctx=4096, tier="batch").spec.priority == "batch"


def test_calls_in_a_row_make_one_assistant_message_and_outputs_may_be_text_parts():
    calls = [{"type": "function_call", "call_id": f"call_{i}", "name": "add", "arguments": f'{{"a":{i}}}'}
             for i in (1, 2)]
    outputs = [{"type": "function_call_output", "call_id": "call_1", "output": "1"},
               {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "2"}]}]
    messages = parse(input=[{"role": "user", "content": "add"}, *calls, *outputs]).spec.prompt.messages
    assert messages[1] == ChatMessage("assistant", "", (ToolCallRecord("call_1", "add", '{"a":1}'),
                                                          ToolCallRecord("call_2", "add", '{"a":2}')))
    assert messages[2:] == (ChatMessage("tool", "1", tool_call_id="call_1"),
                            ChatMessage("tool", "2", tool_call_id="call_2"))


@pytest.mark.parametrize("choice, expected", [
    ("auto", ("auto", None)), ("required", ("required", None)), ("none", ("none", None)),
    ({"type": "function", "name": "add"}, ("named", "add")),
])
def test_tool_choice_maps_to_the_chat_choices(choice, expected):
    tools = parse(tools=[WEATHER, ADD], tool_choice=choice).spec.tools
    assert (tools.choice, tools.named) == expected
    assert tools.functions[1].parameters == ADD["parameters"]


@pytest.mark.parametrize("form, chat_format", [
    ({"type": "text"}, None),
    ({"type": "json_object"}, {"type": "json_object"}),
    ({"type": "json_schema", "name": "city", "schema": PARAMS, "strict": True, "description": "a city"},
     {"type": "json_schema", "json_schema": {"name": "city", "schema": PARAMS, "strict": True,
                                             "description": "a city"}}),
])
def test_text_format_is_the_chat_response_format(form, chat_format):
    chat = {"messages": [{"role": "user", "content": ASK}]} | ({"response_format": chat_format} if chat_format else {})
    assert parse(text={"format": form}).spec == chat_spec(**chat)


def test_store_and_a_reasoning_that_asks_for_nothing_are_accepted():
    for fields in ({"store": True}, {"store": False}, {"reasoning": {"effort": "none"}}, {"reasoning": None},
                   {"include": []}, {"truncation": "disabled"}, {"background": False}, {"previous_response_id": None}):
        assert parse(**fields).spec == parse().spec


REFUSED = [
    ({"previous_response_id": ""}, "previous_response_id", "the id of a stored response"),
    ({"previous_response_id": 7}, "previous_response_id", "the id of a stored response"),
    ({"conversation": "conv_1"}, "conversation", "not conversations"),
    ({"background": True}, "background", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "built-in"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type", "built-in"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type", "built-in"),
    ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type", "built-in"),
    ({"tools": [{"type": "image_generation"}]}, "tools[0].type", "built-in"),
    ({"tools": [WEATHER, {"type": "mcp", "server_label": "x"}]}, "tools[1].type", "built-in"),
    ({"tools": [{"type": "custom", "name": "f"}]}, "tools[0].type", "only function tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type", "text only"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type", "text only"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input[0].content[0].type", "text only"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "does not reason"),
    ({"reasoning": {"effort": "none", "summary": "auto"}}, "reasoning", "does not reason"),
    ({"include": ["message.output_text.logprobs"]}, "include", "not supported"),
    ({"truncation": "auto"}, "truncation", "never cut"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "not an input item"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "not conversations or their items"),
    ({"input": [{"content": "no role or type"}]}, "input[0]", "'type'"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]}, "input[0].call_id",
     "names no earlier function_call"),
    ({"input": turn_with_a_call({"type": "function_call_output", "call_id": "call_2", "output": "x"})},
     "input[3].call_id", "names no earlier function_call"),
    ({"input": turn_with_a_call({"type": "function_call_output", "call_id": "call_1", "output": 3})},
     "input[3].output", "string"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
     "input[0].arguments", "string"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "'developer'"),
    ({"input": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]}, "input[0].content[0].type",
     "text part"),
    ({"input": [{"role": "user", "content": "x", "name": "bob"}]}, "input[0].name", "unknown"),
    ({"input": []}, "input", "non-empty"),
    ({"input": None}, "input", "string"),
    ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
    ({"max_output_tokens": 5000}, "max_output_tokens", "<= 4096"),
    ({"temperature": 3}, "temperature", "<= 2"),
    ({"tools": [{"type": "function", "name": "f g"}]}, "tools[0].name", "letters"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]}, "tools[0].parameters",
     "object"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "add"}}, "tool_choice", "does not declare"),
    ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice", "\"required\""),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice", "'required'"),
    ({"text": {"format": {"type": "json_schema", "schema": PARAMS}}}, "text.format", "name"),
    ({"text": {"format": {"type": "xml"}}}, "text.format", "xml"),
    ({"text": {"verbosity": "high"}}, "text.verbosity", "medium"),
    ({"text": "json"}, "text", "object"),
    ({"tools": [WEATHER], "stop": ["x"]}, "stop", "callable tools"),
    ({"service_tier": "scale"}, "service_tier", "not served"),
    ({"store": "yes"}, "store", "true or false"),
    ({"max_tool_calls": 2}, "max_tool_calls", "unknown"),
    ({"messages": [{"role": "user", "content": "x"}]}, "messages", "unknown"),
]


@pytest.mark.parametrize("fields, param, words", REFUSED, ids=[f"{i}-{r[1]}" for i, r in enumerate(REFUSED)])
def test_each_refusal_is_a_400_naming_the_field_in_responses_terms(fields, param, words):
    with pytest.raises(BadRequest) as err:
        parse(**fields)
    assert err.value.status_code == 400
    assert err.value.param == param, err.value.message
    assert words in err.value.message, err.value.message
    assert ".function" not in err.value.message and "response_format" not in err.value.message
    assert "'max_tokens'" not in err.value.message


# ---------------------------------------------------------------- the response and its stream
def test_a_text_answer_parses_as_the_sdks_response():
    request = parse(instructions="Be brief.", max_output_tokens=32, metadata={"k": "v"})
    answer = ResponseAnswer("resp_1", "gemma", request.spec, request.echo)
    payload = answer.response([result("Hello there.", prompt=40, cached=32, generated=9)])
    assert payload["output"] == [{"id": answer.message_id, "type": "message", "role": "assistant",
                                  "status": "completed", "content": [{"type": "output_text", "text": "Hello there.",
                                                                      "annotations": [], "logprobs": []}]}]
    assert payload["usage"] == {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 32,
                                                                             "cache_write_tokens": 0},
                                "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0},
                                "total_tokens": 49}
    response = Response.model_validate(payload)
    assert response.output_text == "Hello there." and response.status == "completed"
    assert (response.id, response.object, response.model, response.store) == ("resp_1", "response", "gemma", False)
    assert (response.instructions, response.max_output_tokens, response.metadata) == ("Be brief.", 32, {"k": "v"})
    assert response.service_tier == "priority" and response.error is None and response.incomplete_details is None
    assert answer.id.startswith("resp_") and answer.message_id.startswith("msg_")


def test_a_run_out_of_tokens_is_incomplete():
    spec = parse().spec
    for reason in (FinishReason.LENGTH, FinishReason.CONTEXT_LENGTH):
        payload = ResponseAnswer("resp_1", "m", spec, {}).response([result("Hi", reason)])
        assert payload["status"] == "incomplete" and payload["incomplete_details"] == {"reason": "max_output_tokens"}
        assert payload["output"][0]["status"] == "incomplete"


def test_the_echoed_settings_are_the_requests():
    request = parse(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, temperature=0.3,
                    service_tier="flex", store=True, parallel_tool_calls=False)
    response = Response.model_validate(ResponseAnswer("resp_1", "m", request.spec, request.echo).response(
        [result(calls_text([("get_weather", '{"city":"Paris"}')]))]))
    assert response.tools[0].name == "get_weather" and response.tools[0].parameters == PARAMS
    assert response.tool_choice.name == "get_weather" and response.temperature == 0.3
    assert response.service_tier == "flex" and response.store is False and response.parallel_tool_calls is False
    formatted = parse(text={"format": {"type": "json_schema", "name": "c", "schema": PARAMS}})
    response = Response.model_validate(ResponseAnswer("resp_1", "m", formatted.spec, formatted.echo).response(
        [result('{"city":"Paris"}')]))
    assert response.text.format.type == "json_schema" and response.text.format.schema_ == PARAMS


CALLS = calls_text([("get_weather", '{"city":"Paris"}'), ("add", '{"a":2}')])


def test_complete_calls_are_function_call_items():
    spec = parse(tools=[WEATHER, ADD], tool_choice="required").spec
    # Without the request's settings to echo, the response still has what the SDK requires.
    response = Response.model_validate(ResponseAnswer("resp_1", "m", spec, {}).response([result(CALLS)]))
    assert [(o.type, o.name, json.loads(o.arguments), o.status) for o in response.output] == [
        ("function_call", "get_weather", {"city": "Paris"}, "completed"),
        ("function_call", "add", {"a": 2}, "completed")]
    for item in response.output:
        assert item.call_id.startswith("call_") and item.id == "fc_" + item.call_id[len("call_"):]
    assert response.output_text == ""


def test_calls_cut_short_are_not_returned():
    spec = parse(tools=[WEATHER], tool_choice="required").spec
    payload = ResponseAnswer("resp_1", "m", spec, {}).response([result(CALLS[:30], FinishReason.LENGTH)])
    assert payload["output"] == [] and payload["status"] == "incomplete"


def events_of(answer: ResponseAnswer, pieces: list[str], final) -> list[dict]:
    async def collect() -> list[bytes]:
        return [chunk async for chunk in answer.stream([FakeHandle(pieces, final)])]

    events = []
    for chunk in asyncio.run(collect()):
        name, data = chunk.decode().strip().split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[6:])
        assert payload["type"] == name[7:]
        EVENTS.validate_python(payload)  # each one an event the openai SDK knows
        events.append(payload)
    return events


def joined(events: list[dict]) -> list[dict]:
    """A stream's deltas folded into the output items they describe."""
    output: list[dict] = []
    for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert event["output_index"] == len(output)
            output.append(json.loads(json.dumps(event["item"])))
        elif kind == "response.content_part.added":
            output[event["output_index"]]["content"].append(dict(event["part"]))
        elif kind == "response.output_text.delta":
            output[event["output_index"]]["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            output[event["output_index"]]["arguments"] += event["delta"]
        elif kind == "response.output_item.done":
            assert event["item"]["id"] == output[event["output_index"]]["id"]
            output[event["output_index"]]["status"] = event["item"]["status"]
    return output


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("case", ["text", "calls", "auto text", "incomplete"])
def test_the_streamed_events_join_into_the_whole_response(case, seed):
    fields, text, final = {}, "The sky is clear over Paris today.", result("The sky is clear over Paris today.")
    if case == "calls":
        fields, text, final = {"tools": [WEATHER, ADD], "tool_choice": "required"}, CALLS, result(CALLS)
    elif case == "auto text":
        fields = {"tools": [WEATHER, ADD]}
    elif case == "incomplete":
        final = result(text, FinishReason.LENGTH)
    request = parse(**fields)
    whole = ResponseAnswer("resp_1", "m", request.spec, request.echo).response([final])
    events = events_of(ResponseAnswer("resp_1", "m", request.spec, request.echo), split(text, seed), final)
    kinds = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    last = "response.incomplete" if case == "incomplete" else "response.completed"
    assert kinds[-1] == last and kinds.count(last) == 1
    streamed = joined(events)
    final_response = events[-1]["response"]
    for item, expected in zip(streamed, whole["output"]):
        if item["type"] == "message":
            assert item["id"] != expected["id"]  # each answer names its own message: compare the rest
            item["id"] = expected["id"]
        else:
            item["id"], item["call_id"] = expected["id"], expected["call_id"]
    final_response["output"] = [dict(o, id=w["id"], **({"call_id": w["call_id"]} if "call_id" in w else {}))
                                for o, w in zip(final_response["output"], whole["output"])]
    assert streamed == whole["output"] == final_response["output"]
    assert {k: v for k, v in final_response.items() if k not in ("created_at", "output")} == {
        k: v for k, v in whole.items() if k not in ("created_at", "output")}
    if case == "calls":
        assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
        assert kinds.count("response.function_call_arguments.done") == 2 and "response.output_text.delta" not in kinds
    else:
        assert kinds[2:5] == ["response.output_item.added", "response.content_part.added",
                              "response.output_text.delta"]
        assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                                "response.output_item.done"]
        assert events[-4]["text"] == text == "".join(e["delta"] for e in events
                                                     if e["type"] == "response.output_text.delta")


def test_a_call_cut_short_in_a_stream_closes_as_incomplete_and_is_not_in_the_response():
    request = parse(tools=[WEATHER], tool_choice="required")
    cut = CALLS[:60]  # inside the first call's arguments
    events = events_of(ResponseAnswer("resp_1", "m", request.spec, request.echo), [cut],
                       result(cut, FinishReason.LENGTH))
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [d["item"]["status"] for d in done] == ["incomplete"]
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["output"] == []


def test_a_request_that_fails_mid_stream_ends_with_response_failed():
    request = parse()
    events = events_of(ResponseAnswer("resp_1", "m", request.spec, request.echo), ["Hel"],
                       result("Hel", FinishReason.CANCELLED))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert "shutting down" in events[-1]["response"]["error"]["message"]
    assert "response.completed" not in [e["type"] for e in events]


def test_route_errors_over_http_are_in_openais_shape():
    # No lifespan: the model never loads, so a request with a body meets a 503.
    client = TestClient(create_app(lambda: None, ServerSettings()))
    r = client.post("/v1/responses", json=BASE)
    assert r.status_code == 503 and r.json()["error"]["code"] == "loading"
    r = client.post("/v1/responses", content=b"{")
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert client.get("/v1/responses").status_code == 405


def sdk_over(body: bytes, content_type: str) -> openai.OpenAI:
    """An openai client whose every request is answered with `body`, as this server sent it."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body,
                                                                   headers={"content-type": content_type}))
    return openai.OpenAI(base_url="http://cobatch.test/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(transport=transport))


@pytest.mark.parametrize("case", ["text", "calls"])
def test_the_openai_sdk_reads_the_stream_and_its_accumulator_agrees(case):
    fields, text = ({"tools": [WEATHER, ADD], "tool_choice": "required"}, CALLS) if case == "calls" else ({}, ASK)
    request = parse(**fields)

    async def collect() -> bytes:
        answer = ResponseAnswer("resp_1", "m", request.spec, request.echo)
        return b"".join([chunk async for chunk in answer.stream([FakeHandle(split(text, 3), result(text))])])

    client = sdk_over(asyncio.run(collect()), "text/event-stream")
    with client.responses.stream(model="m", input=ASK) as stream:
        final = stream.get_final_response()
    if case == "text":
        assert final.output_text == ASK and final.output[0].content[0].text == ASK
    else:
        assert [(o.name, json.loads(o.arguments)) for o in final.output] == [("get_weather", {"city": "Paris"}),
                                                                             ("add", {"a": 2})]
    events = list(sdk_over(asyncio.run(collect()), "text/event-stream").responses.create(model="m", input=ASK,
                                                                                          stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.id == "resp_1"


def test_output_items_sent_back_through_the_sdk_become_the_conversation():
    """What the SDK sends when a client puts `response.output` into the next request's input."""
    from openai._utils._transform import maybe_transform
    from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

    called = parse(tools=[WEATHER], tool_choice="required")
    calls = Response.model_validate(ResponseAnswer("resp_1", "m", called.spec, called.echo).response(
        [result(calls_text([("get_weather", '{"city":"Paris"}')]))]))
    answered = Response.model_validate(ResponseAnswer("resp_2", "m", parse().spec, {}).response([result("Sunny.")]))
    call_id = calls.output[0].call_id
    body = maybe_transform({"model": "m", "tools": [WEATHER], "input": [
        {"role": "user", "content": ASK}, *calls.output,
        {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
        *answered.output, {"role": "user", "content": "Thanks."}]}, ResponseCreateParamsNonStreaming)
    assert parse_responses_body(body, n_ctx=4096).spec.prompt.messages == (
        ChatMessage("user", ASK), ChatMessage("assistant", "", (ToolCallRecord(call_id, "get_weather",
                                                                               '{"city":"Paris"}'),)),
        ChatMessage("tool", "sunny", tool_call_id=call_id), ChatMessage("assistant", "Sunny."),
        ChatMessage("user", "Thanks."))
