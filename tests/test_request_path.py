"""The request path from a dialect's body to the engine's Request and back: one schema check with one
message on the Python and HTTP paths, chats rendered once at submit, OpenAI's fields refused by
name, and ids formed as OpenAI forms them."""
from __future__ import annotations

import re

import jsonschema
import openai
import pytest

import engine.request
from engine import InvalidParameterError, Request
from server.chat_format import RenderedChat
from server.errors import BadRequest, NotImplementedFeature
from server.openai_schemas import (
    CHAT_UNUSED,
    CHAT_UNSUPPORTED,
    COMPLETION_UNUSED,
    COMPLETION_UNSUPPORTED,
    parse_chat,
    parse_completion,
)
from server.schemas import parse_generate
from server.spec import ChatPrompt, engine_requests
from server.structured import from_response_format
from server.tools import parse_tools

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}
BAD_SCHEMAS = [{"type": "objekt"}, {"type": "object", "properties": {"a": {"minLength": -1}}}, True, [1],
               {"type": "object", "required": "a"}]


# ---------------------------------------------------------------- one schema check
@pytest.fixture
def checks(monkeypatch):
    """How many times a schema is checked."""
    counted = []
    check = engine.request._schema_problem

    def counting(schema):
        counted.append(schema)
        return check(schema)

    monkeypatch.setattr(engine.request, "_schema_problem", counting)
    return counted


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_a_bad_schema_is_refused_with_the_same_message_on_the_python_and_http_paths(schema):
    with pytest.raises(InvalidParameterError) as python:
        Request("x", json_schema=schema)
    assert python.value.field == "json_schema" and str(python.value).startswith("'json_schema' ")
    with pytest.raises(BadRequest) as http:
        parse_generate({"prompt": "x", "json_schema": schema}, n_ctx=64)
    assert http.value.message == str(python.value) and http.value.param == "json_schema"
    # OpenAI's field: the same words, naming the field as the client sent it.
    with pytest.raises(BadRequest) as chat:
        from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    param = "response_format.json_schema.schema"
    assert chat.value.param == param
    assert chat.value.message == str(python.value).replace("'json_schema'", f"'{param}'", 1)


def test_a_schema_is_checked_once_on_each_path(checks):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    Request("x", json_schema=schema)
    assert len(checks) == 1
    spec = parse_generate({"prompt": "x", "json_schema": schema}, n_ctx=64)[0]
    request = spec.request("r")
    assert len(checks) == 2 and request.json_schema == schema  # the Request trusted the route's check
    chat = parse_chat({**CHAT, "response_format": {"type": "json_schema",
                                                   "json_schema": {"name": "s", "schema": schema}}}, n_ctx=64)
    chat.specs[0].request("r", RenderedChat([1]))
    assert len(checks) == 3


def test_tool_parameters_are_checked_once_and_the_calls_frame_is_valid_json_schema(checks):
    weather = {"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "at": {"$ref": "#/$defs/t"}},
        "$defs": {"t": {"type": "string", "format": "date"}}}}}
    parsed = parse_chat({**CHAT, "tools": [weather, {"type": "function", "function": {"name": "v"}}]}, n_ctx=4096)
    assert len(checks) == 2  # one per function's parameters
    request = parsed.specs[0].request("r", RenderedChat([1]))
    assert len(checks) == 2 and request.format == "json"
    for choice in ("required", {"type": "function", "function": {"name": "w"}}):
        schema = parse_tools([weather], choice, False).calls_schema()
        jsonschema.validators.validator_for(schema).check_schema(schema)  # what JsonSchema.assembled trusts


def test_a_schema_found_valid_is_not_validated_again_and_a_bad_one_always_is(monkeypatch):
    validated = []
    validator_for = jsonschema.validators.validator_for

    def counting(schema, *args, **kwargs):
        if isinstance(schema, dict) and "memo_test" in schema.get("properties", {}):  # not a meta-schema
            validated.append(schema)
        return validator_for(schema, *args, **kwargs)

    monkeypatch.setattr(jsonschema.validators, "validator_for", counting)
    schema = {"type": "object", "properties": {"memo_test": {"type": "string", "maxLength": 7}}}
    for _ in range(3):
        Request("x", json_schema=schema)
    assert len(validated) == 1
    Request("x", json_schema={**schema, "required": ["memo_test"]})  # another schema: checked
    assert len(validated) == 2
    for _ in range(2):
        with pytest.raises(InvalidParameterError):
            Request("x", json_schema={**schema, "required": "memo_test"})
    assert len(validated) == 4


def test_a_non_dict_mapping_is_still_a_schema_for_the_python_api():
    from types import MappingProxyType

    request = Request("x", json_schema=MappingProxyType({"type": "object"}))
    assert request.json_schema == {"type": "object"} and request.format == "json"


# ---------------------------------------------------------------- rendering at submit
class CountingChat:
    def __init__(self):
        self.rendered = []

    def render(self, messages, tools=None):
        self.rendered.append((tuple(messages), tools))
        return RenderedChat([7, 8, 9], ("\nuser:",))


def test_a_chat_is_rendered_once_at_submit_for_all_its_choices():
    parsed = parse_chat({**CHAT, "n": 3, "seed": 5, "max_tokens": 4}, n_ctx=64)
    assert all(isinstance(s.prompt, ChatPrompt) for s in parsed.specs)
    chat = CountingChat()
    requests = engine_requests(parsed.specs, ["a", "b", "c"], chat)
    assert len(chat.rendered) == 1 and [r.prompt for r in requests] == [(7, 8, 9)] * 3
    assert [r.request_id for r in requests] == ["a", "b", "c"] and len({r.sampling.seed for r in requests}) == 3
    assert requests[0].stop == ("\nuser:",)
    plain = parse_completion({**COMPLETION, "n": 2}, n_ctx=64)
    assert [r.prompt for r in engine_requests(plain.specs, ["x", "y"], None)] == ["hi", "hi"]


def test_a_chat_spec_needs_its_rendering_and_only_a_chat_spec_takes_one():
    with pytest.raises(TypeError):
        parse_chat(CHAT, n_ctx=64).specs[0].request("r")
    with pytest.raises(TypeError):
        parse_completion(COMPLETION, n_ctx=64).specs[0].request("r", RenderedChat([1]))


# ---------------------------------------------------------------- OpenAI's fields
@pytest.mark.parametrize("parse, body, unsupported", [(parse_completion, COMPLETION, COMPLETION_UNSUPPORTED),
                                                      (parse_chat, CHAT, CHAT_UNSUPPORTED)])
def test_openai_fields_the_engine_cannot_honour_are_501s_naming_them(parse, body, unsupported):
    asking = {"best_of": 2, "suffix": "end", "functions": [{"name": "f"}], "function_call": {"name": "f"},
              "audio": {"voice": "alloy", "format": "mp3"}, "modalities": ["text", "audio"],
              "prediction": {"type": "content", "content": "x"}, "web_search_options": {}, "store": True,
              "reasoning_effort": "low", "verbosity": "low", "service_tier": "flex",
              "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "explicit"},
              "moderation": {"model": "omni-moderation-latest"}}
    for name, (harmless, _) in unsupported.items():
        with pytest.raises(NotImplementedFeature) as err:
            parse({**body, name: asking[name]}, n_ctx=64)
        assert err.value.param == name and err.value.status_code == 501 and name in err.value.message
        for value in harmless:
            parse({**body, name: value}, n_ctx=64)  # asks for nothing: accepted


@pytest.mark.parametrize("parse, body, unused", [(parse_completion, COMPLETION, COMPLETION_UNUSED),
                                                 (parse_chat, CHAT, CHAT_UNUSED)])
def test_fields_that_ask_for_nothing_are_accepted_and_other_fields_still_unknown(parse, body, unused):
    values = {"string": "someone-1", "object": {"team": "a"}}
    parse({**body, **{name: values[kind] for name, kind in unused.items()}}, n_ctx=64)
    for name, kind in unused.items():
        with pytest.raises(BadRequest, match=f"'{name}' must be an? {kind}") as err:
            parse({**body, name: 5}, n_ctx=64)
        assert err.value.param == name
    with pytest.raises(BadRequest, match=r"unknown field\(s\): 'colour'"):
        parse({**body, "colour": "blue"}, n_ctx=64)


def _sdk_fields(module) -> set[str]:
    fields = set()
    for cls in module.CompletionCreateParamsBase.__mro__:
        fields |= set(getattr(cls, "__annotations__", {}))
    return fields


@pytest.mark.parametrize("parse, body, module", [
    (parse_completion, COMPLETION, openai.types.completion_create_params),
    (parse_chat, CHAT, openai.types.chat.completion_create_params),
])
def test_every_field_the_openai_sdk_sends_is_known_by_name(parse, body, module):
    """Each field of the official client's request type is read, refused by name or left
    unused by name: never "unknown field"."""
    fields = _sdk_fields(module) - set(body)
    assert {"temperature", "user", "stream_options"} <= fields  # the type was found
    for name in sorted(fields):
        try:
            parse({**body, name: None}, n_ctx=64)
        except (BadRequest, NotImplementedFeature) as exc:
            assert "unknown field" not in exc.message, exc.message


# ---------------------------------------------------------------- ids, through the openai client
MODEL = "gemma-3-270m-Q4_K_M"


@pytest.mark.model
def test_openai_ids_have_one_prefix_and_name_the_whole_response(openai_client):
    completion = openai_client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    assert re.fullmatch(r"cmpl-[0-9a-f]{24}", completion.id), completion.id
    chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=2, temperature=0, n=2)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", chat.id), chat.id  # n=2: still the request's one id
    raw = openai_client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, n=2)
    assert raw.headers["x-request-id"] == raw.parse().id
    assert len({completion.id, chat.id, raw.parse().id}) == 3


@pytest.mark.model
def test_stream_chunks_carry_the_response_id(openai_client):
    args = dict(model=MODEL, max_tokens=3, temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(openai_client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], n=2, **args))
    assert len(chunks) >= 4 and len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", chunks[0].id)
    text_chunks = list(openai_client.completions.create(prompt="Hello", **args))
    assert len({c.id for c in text_chunks}) == 1 and re.fullmatch(r"cmpl-[0-9a-f]{24}", text_chunks[0].id)


@pytest.mark.model
def test_a_bad_schema_gets_the_pythons_message_over_http_and_changes_nothing(engine, http, live):
    schema = {"type": "object", "properties": {"a": {"type": "strin"}}}
    with pytest.raises(InvalidParameterError) as python:
        engine.submit("x", json_schema=schema, max_tokens=8)
    assert engine.stats().running == 0 and sum(engine.stats().waiting.values()) == 0
    steps = live.engine.stats().steps
    response = http.post("/generate", json={"prompt": "x", "json_schema": schema, "max_tokens": 8})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == str(python.value) and "properties/a/type" in str(python.value)
    response = http.post("/v1/chat/completions", json={**CHAT, "model": MODEL, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "response_format.json_schema.schema"
    assert error["message"].endswith(str(python.value).removeprefix("'json_schema'"))
    assert live.engine.stats().steps == steps


def test_speculative_and_the_callers_draft_scope_reach_the_engines_request():
    from server.openai_schemas import parse_completion

    on, off = (parse_completion({"model": "m", "prompt": "hi", **extra}, n_ctx=512).specs[0]
               for extra in ({}, {"speculative": False}))
    (first,), (second,) = (engine_requests([spec], ["r"], None, draft_scope="key-abc") for spec in (on, off))
    assert first.speculative and not second.speculative and first.draft_scope == second.draft_scope == "key-abc"
    assert not parse_generate({"prompt": "hi", "speculative": False}, n_ctx=512)[0].speculative
    with pytest.raises(BadRequest, match="speculative"):
        parse_generate({"prompt": "hi", "speculative": "no"}, n_ctx=512)
