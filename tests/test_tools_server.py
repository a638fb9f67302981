"""Tool calling against a real `cobatch serve`, driven by the clients agents use: the openai SDK
and pydantic-ai. Every answer that calls functions must carry complete calls, valid against
their functions' parameters; refusals are 400s that leave the server as it was."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.tool_sets import FUNCTIONS, PROMPTS
from tests.server_fixtures import serve_process, wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    with serve_process("--n-ctx", "4096", "--flash-attn", "off") as (_, url):
        yield url


@pytest.fixture(scope="module")
def uncached_http(tmp_path_factory):
    """A server whose every request, alone, lies in the same cells: the streamed-versus-whole
    comparison needs the same logits twice. Cached blocks of earlier answers between a prompt's
    cached prefix and its own cells move a sampled token even with flash attention off
    (docs/evaluation.md), so the prefix cache is off."""
    with serve_process("--n-ctx", "4096", "--flash-attn", "off", "--no-prefix-cache",
                       "--data-dir", str(tmp_path_factory.mktemp("uncached"))) as (_, url):
        with httpx.Client(base_url=url, timeout=300) as c:
            yield c


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=300) as c:
        yield c


def _declared(tools):
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}


def check_calls(message, tools, allowed=None):
    """Every call names a callable function and its arguments parse and validate."""
    declared = _declared(tools)
    calls = message["tool_calls"]
    assert calls and message["content"] is None
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        assert name in (allowed or declared)
        jsonschema.validate(json.loads(call["function"]["arguments"]), declared[name],
                            format_checker=jsonschema.FormatChecker())
    assert len({c["id"] for c in calls}) == len(calls)


def post(http, **body):
    return http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 80, **body})


def streamed(http, **body) -> tuple[dict, str, list[dict]]:
    """The streamed answer reassembled into a non-streamed message: (message, finish_reason, chunks)."""
    chunks = []
    with http.stream("POST", "/v1/chat/completions",
                     json={"model": MODEL, "messages": ASK, "max_tokens": 80, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    content, calls, finish = "", {}, None
    for chunk in chunks:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for part in delta.get("tool_calls") or []:
            if part["index"] not in calls:  # the first delta of a call carries id, type and name
                assert part["id"] and part["type"] == "function" and part["function"]["name"]
                calls[part["index"]] = {"id": part["id"], "type": "function",
                                        "function": {"name": part["function"]["name"], "arguments": ""}}
            else:
                assert "id" not in part and "name" not in part["function"]
            calls[part["index"]]["function"]["arguments"] += part["function"].get("arguments", "")
        finish = choice["finish_reason"] or finish
    assert sorted(calls) == list(range(len(calls)))
    message = {"role": "assistant", "content": None if calls else content,
               "tool_calls": [calls[i] for i in sorted(calls)] if calls else None}
    return message, finish, chunks


def _no_ids(message):
    calls = message.get("tool_calls") or []
    return message.get("content"), [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def _brace_bias(http) -> dict[str, int]:
    """A logit_bias that makes the model open a call (`{`, `{"`), to exercise auto's call branch."""
    ids = http.post("/tokenize", json={"content": '{"tool'}).json()["tokens"][:1]
    ids += http.post("/tokenize", json={"content": "{"}).json()["tokens"]
    return {str(t): 30 for t in ids}


# ---------------------------------------------------------------- the openai SDK
def test_two_turn_round_trip_with_a_tool_message_hits_the_prefix_cache(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=60, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    messages = ASK + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear", "args": arguments})}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=20,
                                            temperature=0)
    counted = httpx.post(f"{client.base_url}".removesuffix("/v1/") + "/tokenize",
                         json={"messages": messages, "tools": TOOLS}).json()["count"]
    assert counted == second.usage.prompt_tokens  # /tokenize renders tools and calls the same way
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # Turn 2 begins with turn 1's prompt, rendered identically, then the call echoed as the grammar
    # wrote it: the prefix cache serves all of turn 1's prompt but its last partial block (16 tokens).
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16


@pytest.mark.parametrize("choice", ["required", "named", "auto", "auto-call"])
def test_streamed_calls_reassemble_into_the_non_streamed_answer(uncached_http, choice):
    # Without drafts: whether a step drafts depends on earlier outputs and measured step costs,
    # so only then do the compared requests run the same steps (docs/speculative-decoding.md).
    http = uncached_http
    body = {"tools": TOOLS, "temperature": 0.7, "seed": 11, "speculative": False}
    if choice == "named":
        body["tool_choice"] = {"type": "function", "function": {"name": "add"}}
    elif choice == "auto-call":
        body["logit_bias"] = _brace_bias(http)
    else:
        body["tool_choice"] = choice
    whole = post(http, **body).json()["choices"][0]
    message, finish, chunks = streamed(http, **body)
    assert finish == whole["finish_reason"]
    assert _no_ids(message) == _no_ids(whole["message"])
    assert chunks[-1]["choices"][0]["finish_reason"] == finish
    if choice == "auto":
        assert finish in ("stop", "length") and isinstance(message["content"], str)
        return
    assert finish == "tool_calls"
    check_calls(whole["message"], TOOLS, ["add"] if choice == "named" else None)
    if choice == "named":
        assert len(whole["message"]["tool_calls"]) == 1


def test_auto_begins_a_call_only_when_the_budget_can_finish_it(http):
    refused = post(http, tools=TOOLS, tool_choice="required", max_tokens=1).json()["error"]
    needed = int(refused["message"].split("needs ")[1].split()[0])
    pushed = {"tools": TOOLS, "logit_bias": _brace_bias(http), "temperature": 1.0}
    for seed in range(2):  # exactly enough: the pushed model opens a call, and the call is finished
        choice = post(http, **pushed, seed=seed, max_tokens=needed).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        check_calls(choice["message"], TOOLS)
        # one token short: no call may begin, so the answer is text, even pushed towards `{`
        choice = post(http, **pushed, seed=seed, max_tokens=needed - 1).json()["choices"][0]
        assert "tool_calls" not in choice["message"] and not choice["message"]["content"].startswith("{")


def test_n_choices_each_hold_the_guarantee(http):
    response = post(http, tools=TOOLS, tool_choice="required", n=3, temperature=1.0, seed=5).json()
    assert [c["index"] for c in response["choices"]] == [0, 1, 2]
    ids = []
    for c in response["choices"]:
        assert c["finish_reason"] == "tool_calls"
        check_calls(c["message"], TOOLS)
        ids += [call["id"] for call in c["message"]["tool_calls"]]
    assert len(set(ids)) == len(ids)


def test_parallel_tool_calls_false_allows_one_call(http):
    for seed in range(3):
        message = post(http, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed,
                       temperature=1.0).json()["choices"][0]["message"]
        assert len(message["tool_calls"]) == 1


# ---------------------------------------------------------------- pydantic-ai
def test_pydantic_ai_agent_with_a_function_tool_and_a_tool_output(server):
    from pydantic import BaseModel
    from pydantic_ai import Agent, ToolOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    class City(BaseModel):
        name: str
        country: str

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=f"{server}/v1", api_key="unused"))
    agent = Agent(model, output_type=ToolOutput(City, name="final_city"),
                  model_settings=ModelSettings(max_tokens=80, temperature=0.0, seed=1))
    asked: list[str] = []

    @agent.tool_plain
    def capital_of(country: str) -> str:
        """The capital city of a country."""
        asked.append(country)
        return "Paris"

    result = agent.run_sync("What is the capital of France? Look it up, then answer.")
    assert isinstance(result.output, City)
    parts = [type(p).__name__ for m in result.all_messages() for p in m.parts]
    assert "ToolCallPart" in parts  # the model answered through calls, which pydantic-ai validated


# ---------------------------------------------------------------- refusals
REFUSALS = [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [ADD, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}], "tool_choice": "required"},
     "tools[1].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "required", "max_tokens": 3}, "max_tokens"),
    ({"tools": TOOLS, "stop": ["\n"]}, "stop"),
    ({"tools": TOOLS, "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}}, "response_format"),
]


@pytest.mark.parametrize("body, param", REFUSALS)
def test_refusals_name_the_field_and_leave_the_server_healthy(http, body, param):
    r = post(http, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    if param == "max_tokens":
        assert "needs" in error["message"] and "tool call" in error["message"]
    if param == "tools[1].function.parameters":
        assert "'not'" in error["message"] and "/properties/x" in error["message"]

    def idle():
        health = http.get("/health").json()
        return health["running"] == 0 and health["kv"]["cells_used"] == 0 and not any(health["queue"].values())

    wait_until(idle, 30, "the server did not return to idle")
    assert post(http, max_tokens=2).status_code == 200


# ---------------------------------------------------------------- the property
@st.composite
def tool_requests(draw):
    functions = draw(st.lists(st.sampled_from(FUNCTIONS), min_size=1, max_size=3, unique_by=lambda f: f["name"]))
    tools = [{"type": "function", "function": f} for f in functions]
    mode = draw(st.sampled_from(["required", "named", "auto"]))
    choice = ({"type": "function", "function": {"name": draw(st.sampled_from(functions))["name"]}}
              if mode == "named" else mode)
    return {"tools": tools, "tool_choice": choice, "messages": [{"role": "user", "content": draw(st.sampled_from(PROMPTS))}],
            "seed": draw(st.integers(0, 2**31)), "temperature": draw(st.sampled_from([0.0, 0.7, 1.0, 1.5])),
            "parallel_tool_calls": draw(st.booleans()), "slack": draw(st.sampled_from([0, 0, 3, 30]))}


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=tool_requests())
def test_every_answer_is_text_or_complete_valid_calls(http, request):
    slack = request.pop("slack")
    forced = request["tool_choice"] != "auto"
    if forced:  # the shortest call's length comes from the refusal below it, then max_tokens sits at it
        refused = post(http, **request, max_tokens=1)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
        needed = int(refused.json()["error"]["message"].split("needs ")[1].split()[0])
    else:
        needed = 8
    r = post(http, **request, max_tokens=needed + slack)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    allowed = [request["tool_choice"]["function"]["name"]] if isinstance(request["tool_choice"], dict) else None
    if choice["finish_reason"] == "tool_calls":
        check_calls(message, request["tools"], allowed)
        if allowed or not request["parallel_tool_calls"]:
            assert len(message["tool_calls"]) == 1
    else:
        assert not forced, choice  # required and named always call, within the budget
        assert isinstance(message["content"], str) and "tool_calls" not in message
