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


def test_auto_text_then_a_call_gives_content_beside_tool_calls(client, model_id, server):
    """Qwen 2.5 may write words before `<tool_call>`: the grammar takes over at the marker, and the
    answer is the words as content beside the parsed calls, streamed or not. The tiny model is
    nudged (logit_bias) to choose between "Sure" and `<tool_call>`, seeded (the batch's shape can
    still tip its near-uniform draws, so the stream is checked on its own)."""
    with httpx.Client(base_url=server, timeout=120) as http:
        [sure] = http.post("/tokenize", json={"content": "Sure"}).json()["tokens"]
        [marker] = http.post("/tokenize", json={"content": "<tool_call>"}).json()["tokens"]
    nudged = {"tools": TOOLS, "n": 6, "seed": 11, "temperature": 1.0, "max_tokens": 120,
              "logit_bias": {str(sure): 50, str(marker): 50}}

    def kind(finish_reason: str, content: str | None, calls: list[tuple[str, str]]) -> str:
        if finish_reason != "tool_calls":  # words to the end of the budget, never a call left unread
            assert finish_reason == "length" and not calls and "<tool_call>" not in content
            return "text"
        assert calls and (content is None or set(content.split("Sure")) == {""})
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), PARAMETERS[name])
        return "text then calls" if content else "calls"

    answer = client.chat.completions.create(model=model_id, messages=ASK, **nudged)
    kinds = {kind(c.finish_reason, c.message.content,
                  [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []])
             for c in answer.choices}
    assert "text then calls" in kinds
    contents, calls, reasons = {}, {}, {}
    for chunk in client.chat.completions.create(model=model_id, messages=ASK, stream=True, **nudged):
        for choice in chunk.choices:
            contents[choice.index] = contents.get(choice.index, "") + (choice.delta.content or "")
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault((choice.index, delta.index), ["", ""])
                entry[0] += delta.function.name or ""
                entry[1] += delta.function.arguments or ""
    streamed = {kind(reasons[i], contents[i] or None, [tuple(calls[k]) for k in sorted(calls) if k[0] == i])
                for i in range(6)}
    assert "text then calls" in streamed


def _nudge(server: str) -> dict:
    """logit_bias (an extension on every route) towards "Sure" and `<tool_call>`."""
    with httpx.Client(base_url=server, timeout=120) as http:
        ids = [http.post("/tokenize", json={"content": text}).json()["tokens"][0] for text in ("Sure", "<tool_call>")]
    return {"logit_bias": {str(t): 50 for t in ids}}


def test_responses_and_messages_give_the_text_before_calls_as_their_own_item_and_block(client, model_id, server):
    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0, timeout=120)
    tool_specs = [{"type": "function", **t["function"]} for t in TOOLS]
    claude_tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                     "input_schema": t["function"]["parameters"]} for t in TOOLS]
    found = set()
    for seed in range(12):  # the nudged model writes words then a call under some seeds, not all
        extra = {**_nudge(server), "seed": seed}
        response = client.responses.create(model=model_id, input="What is the weather in Oslo?", tools=tool_specs,
                                           temperature=1.0, max_output_tokens=120, extra_body=extra)
        kinds = [item.type for item in response.output]
        if kinds[:1] == ["message"] and "function_call" in kinds:
            assert kinds[1:] == ["function_call"] * (len(kinds) - 1) and response.status == "completed"
            assert set(response.output[0].content[0].text.split("Sure")) == {""}
            found.add("responses")
        message = claude.messages.create(model=model_id, max_tokens=120, tools=claude_tools,
                                         messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
                                         extra_body={**extra, "temperature": 1.0})  # not in this SDK's signature
        blocks = [block.type for block in message.content]
        if blocks[:1] == ["text"] and "tool_use" in blocks:
            assert blocks[1:] == ["tool_use"] * (len(blocks) - 1) and message.stop_reason == "tool_use"
            assert set(message.content[0].text.split("Sure")) == {""}
            for block in message.content[1:]:
                jsonschema.validate(block.input, PARAMETERS[block.name])
            found.add("messages")
        if found == {"responses", "messages"}:
            break
    assert found == {"responses", "messages"}
