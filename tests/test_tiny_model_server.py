"""A real `cobatch serve` on a tiny random-weight model carrying Qwen 2.5's chat template and
tokenizer (bench/tiny_model.py, built at test time: no weights downloaded), through the `openai`
SDK: `required` and a named tool give calls written in Hermes' `<tool_call>` syntax (the
generated tokens say so), parsed into `tool_calls` with arguments valid against the schema; a
streamed call joins into the non-streamed one; a second turn renders the call and its result as
the template does, is served from the prefix cache, and answers."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from bench.llama_vocab import VocabUnavailable
from bench.tiny_model import tiny_model_path
from tests.server_fixtures import serve_process

pytestmark = pytest.mark.model

WEATHER_PARAMETERS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}
TIME_PARAMETERS = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                   "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER_PARAMETERS}},
         {"type": "function", "function": {"name": "get_time", "description": "Time now",
                                           "parameters": TIME_PARAMETERS}}]
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
# Greedy (flash attention off, the server's flag): the same prompt gives the same tokens.
GREEDY = {"temperature": 0, "max_tokens": 80}


@pytest.fixture(scope="module")
def server():
    try:
        model = tiny_model_path("hermes")  # built once into the cache
    except VocabUnavailable as exc:
        pytest.skip(f"llama.cpp's vocab GGUFs are not available: {exc}")
    with serve_process("--model", str(model), "--n-ctx", "4096", "--flash-attn", "off") as (_, url):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model_id(client) -> str:
    return client.models.list().data[0].id


def assert_valid_calls(message, allowed: set[str]) -> None:
    assert message.content is None and message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name],
                            format_checker=jsonschema.FormatChecker())


def generated_text(choice) -> str:
    """The tokens the model generated, joined (chat logprobs carry every token's bytes)."""
    return b"".join(bytes(t.bytes) for t in choice.logprobs.content).decode("utf-8")


def hermes_text(calls) -> str:
    return "\n".join(f'<tool_call>\n{{"name": "{c.function.name}", "arguments": {c.function.arguments}}}\n</tool_call>'
                     for c in calls)


# Found here (2026-11-28): calls that ended exactly at max_tokens were reported as cut short
# ("length", no tool_calls); a grammar's output complete at its budget now ends as "stop".
def test_required_calls_are_written_in_hermes_syntax(client, model_id):
    answer = client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, tool_choice="required",
                                            logprobs=True, **GREEDY)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert_valid_calls(choice.message, set(PARAMETERS))
    assert generated_text(choice) == hermes_text(choice.message.tool_calls)


def test_a_named_tool_is_the_one_called(client, model_id):
    named = {"type": "function", "function": {"name": "get_time"}}
    answer = client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, tool_choice=named,
                                            logprobs=True, seed=7, temperature=0.8, max_tokens=80)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert_valid_calls(choice.message, {"get_time"})
    assert len(choice.message.tool_calls) == 1
    assert generated_text(choice) == hermes_text(choice.message.tool_calls)


def test_a_streamed_call_joins_into_the_same_call(client, model_id):
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, tool_choice=named, **GREEDY)
    expected = whole.choices[0].message.tool_calls[0]
    starts, fragments, reasons = [], [], []
    for chunk in client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, tool_choice=named,
                                                stream=True, **GREEDY):
        choice = chunk.choices[0]
        reasons.append(choice.finish_reason)
        for delta in choice.delta.tool_calls or []:
            assert delta.index == 0
            if delta.id is not None:
                starts.append((delta.id, delta.function.name))
            fragments.append(delta.function.arguments or "")
    assert [name for _, name in starts] == ["get_weather"] and starts[0][0].startswith("call_")
    assert "".join(fragments) == expected.function.arguments
    assert len(fragments) > 2  # arguments arrived in pieces, not in one closing delta
    assert [r for r in reasons if r] == ["tool_calls"] and reasons[-1] == "tool_calls"


def test_a_second_turn_renders_the_call_and_its_result_and_answers(client, model_id, server):
    first = client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    call = first.choices[0].message.tool_calls[0]
    result = '{"sky": "clear", "celsius": 21}'
    messages = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": result}]
    with httpx.Client(base_url=server, timeout=120) as http:
        tokens = http.post("/tokenize", json={"messages": messages, "tools": TOOLS}).json()["tokens"]
        prompt = http.post("/detokenize", json={"tokens": tokens}).json()["content"]
    # Qwen 2.5's template: the call echoed in its syntax, its arguments re-serialised by the template's
    # tojson (", " and ": "), the result in a user turn's <tool_response> (/detokenize drops special tokens).
    echoed = f'<tool_call>\n{{"name": "{call.function.name}", "arguments": {json.dumps(json.loads(call.function.arguments))}}}\n</tool_call>'
    assert echoed in prompt
    assert f"user\n<tool_response>\n{result}\n</tool_response>\nassistant\n" in prompt
    second = client.chat.completions.create(model=model_id, messages=messages, tools=TOOLS, max_tokens=24, seed=3,
                                            temperature=0.8)
    choice = second.choices[0]
    assert second.usage.prompt_tokens == len(tokens)
    # Turn 1's prompt and call come back token for token: the prefix cache serves them (full 16-token blocks).
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    if choice.finish_reason == "tool_calls":
        assert_valid_calls(choice.message, set(PARAMETERS))
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
        assert isinstance(choice.message.content, str) and choice.message.content
