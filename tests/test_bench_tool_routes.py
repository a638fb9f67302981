"""`cobatch bench tools`' routes without a model: each dialect's body carries the same request,
and one judge reads every dialect's answer the same way."""
from __future__ import annotations

import pytest

from bench.tool_routes import ROUTES
from bench.tools import judge
from server.anthropic_schemas import parse_messages_body
from server.openai_schemas import parse_chat
from server.responses_schemas import parse_responses_body

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 64, "temperature": 0.8,
        "seed": 3, "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                                                               "parameters": PARAMS}},
                             {"type": "function", "function": {"name": "ping"}}]}
CHOICES = {"required": "required", "auto": "auto", "named": {"type": "function", "function": {"name": "ping"}}}


@pytest.mark.parametrize("mode", list(CHOICES))
def test_every_route_asks_the_chat_routes_request(mode):
    """Each body, read by cobatch's own parser of its route, is the chat body's spec."""
    chat = {**CHAT, "tool_choice": CHOICES[mode]}
    expected = parse_chat({"model": "m", **chat}, n_ctx=4096).specs[0]
    responses = parse_responses_body(ROUTES["responses"].body(chat, "m"), n_ctx=4096).spec
    messages = parse_messages_body(ROUTES["messages"].body(chat, "m"), n_ctx=4096).spec
    for spec in (responses, messages):
        assert spec.prompt == expected.prompt and spec.max_tokens == 64 and spec.seed == 3
        assert spec.tools.choice == expected.tools.choice and spec.tools.named == expected.tools.named
        assert [f.name for f in spec.tools.callable] == [f.name for f in expected.tools.callable]
        assert spec.temperature == pytest.approx(0.8)


CALL = {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
ANSWERS = {
    "chat": ({"choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": CALL}]}}]},
             {"choices": [{"finish_reason": "stop", "message": {"content": "Sunny."}}]}),
    "responses": ({"status": "completed", "output": [{"type": "function_call", "call_id": "c", **CALL}]},
                  {"status": "completed", "output": []}),  # an empty answer has no items
    "messages": ({"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t", "name": "get_weather",
                                                          "input": {"city": "Oslo"}}]},
                 {"stop_reason": "end_turn", "content": [{"type": "text", "text": "Sunny."}]}),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_one_judge_reads_every_dialect(route):
    called, text = (ROUTES[route].read(a) for a in ANSWERS[route])
    request = {"mode": "auto", "body": {**CHAT, "tool_choice": "auto"}}
    assert judge(request, 200, called) == {"answered": True, "valid": True, "called": True, "why": ""}
    assert judge(request, 200, text)["valid"] and not judge(request, 200, text)["called"]
    required = {"mode": "required", "body": {**CHAT, "tool_choice": "required"}}
    assert not judge(required, 200, text)["valid"]  # required must call
    named = {"mode": "named", "body": {**CHAT, "tool_choice": CHOICES["named"]}}
    assert judge(named, 200, called)["why"] == "called 'get_weather'"
    assert judge(request, 404, None) == {"answered": False, "valid": False, "called": False, "why": "HTTP 404"}


def test_a_call_with_invalid_arguments_or_cut_short_is_not_valid():
    request = {"mode": "required", "body": {**CHAT, "tool_choice": "required"}}
    bad = ROUTES["messages"].read({"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {"town": "Oslo"}}]})
    assert judge(request, 200, bad)["why"].startswith("ValidationError")
    cut = ROUTES["responses"].read({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                                    "output": [{"type": "function_call", **CALL}]})
    assert judge(request, 200, cut)["why"] == "calls, but incomplete (max_output_tokens)"
