"""Tool calling without the model: request validation, the calls schema, the prompt, the reader
that both streamed and non-streamed answers go through, the triggered grammar, Jinja templates."""
from __future__ import annotations

import random
from dataclasses import replace

import jsonschema
import pytest

from sampling.grammar import compile_grammar
from sampling.grammar.trigger import TriggeredMatcher
from server.chat_format import ChatFormatter, ChatMessage, ToolCallRecord, gemma_segments, parse_messages
from server.errors import BadRequest, InternalError
from server.jinja_chat import JinjaChat, handles_tools
from server.native_reader import spec_reader
from server.tool_families import family
from server.tool_syntax import derive
from server.openai_schemas import parse_chat
from server.tool_prompt import plain_turns
from server.tool_reader import Arguments, CallStart, Text, ToolOutputReader
from server.tools import calls_text, parse_tools, relocate_refs
from tests.test_grammar_support import EOG, VOCAB

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}
TREE = {"type": "function", "function": {"name": "plant", "parameters": {
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                 "maxItems": 2}},
                       "required": ["v"]}},
    "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}}}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields):
    return parse_chat({**BODY, **fields}, n_ctx=4096)


# ---------------------------------------------------------------- request validation
def test_tool_choice_defaults_and_modes():
    assert chat(tools=[WEATHER]).specs[0].tools.choice == "auto"
    assert chat(tools=[WEATHER], tool_choice="none").specs[0].structured is None  # nothing callable: plain text
    req = chat(tools=[WEATHER, TREE], tool_choice={"type": "function", "function": {"name": "plant"}})
    assert req.specs[0].tools.choice == "named" and [f.name for f in req.specs[0].tools.callable] == ["plant"]
    assert req.specs[0].structured.schema["properties"]["tool_calls"]["maxItems"] == 1
    assert "maxItems" not in chat(tools=[WEATHER], tool_choice="required").specs[0].structured.schema[
        "properties"]["tool_calls"]
    assert chat(tools=[WEATHER], parallel_tool_calls=False).specs[0].structured.schema[
        "properties"]["tool_calls"]["maxItems"] == 1
    request = replace(chat(tools=[WEATHER]).specs[0], prompt=[1]).request("r")
    assert request.json_or_text and request.format == "json"
    assert not replace(chat(tools=[WEATHER], tool_choice="required").specs[0], prompt=[1]).request("r").json_or_text


@pytest.mark.parametrize("fields, param, needle", [
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "does not declare"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "must be one of"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "declared twice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name", "letters"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools[0].function.name", "64"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
     "tools[0].function.parameters", "not a valid JSON Schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "object"),
    ({"tools": [WEATHER], "stop": ["\n"]}, "stop", "callable tools"),
    ({"tools": [WEATHER], "open_objects": True, "response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object"}}}}, "open_objects", "callable tools"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
])
def test_bad_tool_requests_are_400s_naming_the_field(fields, param, needle):
    with pytest.raises(BadRequest) as err:
        chat(**fields)
    assert err.value.param == param and needle in err.value.message, err.value.message


def test_stop_and_response_format_are_fine_when_nothing_is_callable():
    assert chat(tools=[WEATHER], tool_choice="none", stop=["\n"]).specs[0].stop == ("\n",)
    req = chat(tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"})
    assert req.specs[0].structured.source == "response_format"


ANSWER = {"type": "object", "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
          "required": ["city", "celsius"]}
ANSWER_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


def test_a_format_beside_auto_tools_is_what_an_answer_without_calls_follows():
    spec = chat(tools=[WEATHER], response_format=ANSWER_FORMAT).specs[0]
    assert spec.answer_format.source == "response_format" and dict(spec.answer_format.schema) == ANSWER
    assert spec.structured.source == "tools"  # calls stay the grammar's first alternative
    request = replace(spec, prompt=[1]).request("r")
    assert not request.json_or_text and request.json_alternative.opening == '{"tool_calls":['
    assert dict(request.json_alternative.schema) == ANSWER
    any_object = replace(chat(tools=[WEATHER], response_format={"type": "json_object"}).specs[0], prompt=[1])
    assert any_object.request("r").json_alternative.schema is None
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        forced = replace(chat(tools=[WEATHER], tool_choice=choice, response_format=ANSWER_FORMAT).specs[0], prompt=[1])
        assert forced.answer_format is None and forced.request("r").json_alternative is None  # this turn calls


@pytest.mark.parametrize("seed", range(10))
def test_the_format_reader_waits_for_the_opening_then_reads_calls_or_the_answer(seed):
    tools = parse_tools([WEATHER], None, None)
    rng = random.Random(seed)
    answer = '{"city":"Oslo","celsius":-3}'
    call = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'
    for doc in (answer, call, '{"tool_calls":7,"city":"x","celsius":1}'):
        cuts = sorted(rng.sample(range(1, len(doc)), rng.randint(1, 12)))
        reader = ToolOutputReader(tools, "format", answer_schema=ANSWER if doc == answer else None)
        events = [e for a, b in zip([0] + cuts, cuts + [len(doc)]) for e in reader.feed(doc[a:b])]
        calls = reader.finish(stopped=True)
        if doc == call:
            assert reader.is_calls and [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city":"Oslo"}')]
            assert [e.name for e in events if isinstance(e, CallStart)] == ["get_weather"]
        else:
            assert calls is None and "".join(e.text for e in events) == doc == reader.content()
    undecided = ToolOutputReader(tools, "format", answer_schema=ANSWER)
    assert undecided.feed('{"tool') == [] and undecided.finish(stopped=False) is None and undecided.content() == ""
    wrong = ToolOutputReader(tools, "format", answer_schema=ANSWER)
    wrong.feed('{"city":"Oslo"}')
    with pytest.raises(InternalError, match="not valid against the output format"):
        wrong.finish(stopped=True)
    assert wrong.finish(stopped=False) is None  # a cut-short answer is not checked: it is reported as cut


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_a_format_beside_tools_in_a_models_own_syntax_opens_calls_with_that_syntax(name):
    """A native frame under auto with a format: the calls alternative is the frame (its start the
    opening), the format's document the other; the reader waits for that start too."""
    syntax = family(name).syntax
    spec = parse_chat({**BODY, "tools": [WEATHER], "response_format": ANSWER_FORMAT}, n_ctx=4096,
                      tool_syntax=syntax).specs[0]
    request = replace(spec, prompt=[1]).request("r")
    assert request.tool_frame is not None and request.json_schema is None and not request.json_or_text
    assert request.json_alternative.opening == syntax.start == spec.tools.calls_opening
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        forced = parse_chat({**BODY, "tools": [WEATHER], "tool_choice": choice, "response_format": ANSWER_FORMAT},
                            n_ctx=4096, tool_syntax=syntax).specs[0]
        assert replace(forced, prompt=[1]).request("r").json_alternative is None  # this turn calls
    call = syntax.calls_text([("get_weather", '{"city": "Oslo"}', "abcdefghi")])
    for text, calls in ((call, 1), ('{"city":"Oslo","celsius":-3}', 0)):
        reader = spec_reader(spec)
        assert (reader.feed(text[:1]) == []) == syntax.start.startswith(text[:1])  # undecided while it may open
        reader.feed(text[1:])
        assert len(reader.finish(stopped=True) or []) == calls
        assert reader.content() == ("" if calls else text)


def test_tool_and_tool_call_messages():
    messages = parse_messages([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
    ])
    assert messages[1].tool_calls == (ToolCallRecord("call_1", "get_weather", '{"city":"Oslo"}'),)
    assert messages[2].tool_call_id == "call_1" and messages[2].content == "cold"
    with pytest.raises(BadRequest, match="tool_call_id"):
        parse_messages([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}])
    with pytest.raises(BadRequest, match="tool_calls"):
        parse_messages([{"role": "user", "content": "x", "tool_calls": []}])
    with pytest.raises(BadRequest, match="arguments"):
        parse_messages([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}])


# ---------------------------------------------------------------- the calls schema
def test_refs_are_relocated_and_the_schema_compiles_and_validates():
    tools = parse_tools([WEATHER, TREE], "required", None)
    schema = tools.calls_schema()
    plant = schema["properties"]["tool_calls"]["items"]["anyOf"][1]["properties"]["arguments"]
    base = "#/properties/tool_calls/items/anyOf/1/properties/arguments"
    assert plant["properties"]["root"]["$ref"] == base + "/$defs/node"
    assert plant["$defs"]["node"]["properties"]["kids"]["items"]["$ref"] == base + "/$defs/node"
    assert TREE["function"]["parameters"]["properties"]["root"]["$ref"] == "#/$defs/node"  # the client's is untouched
    doc = {"tool_calls": [{"name": "plant", "arguments": {"root": {"v": 1, "kids": [{"v": 2}]}}}]}
    jsonschema.validate(doc, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": [{"name": "plant", "arguments": {"root": {"v": "x"}}}]}, schema)
    compile_grammar(schema, VOCAB)  # the grammar compiler resolves the moved references


def test_relocation_leaves_data_alone():
    schema = {"const": {"$ref": "#/x"}, "properties": {"$ref": {"$ref": "#"}}}
    assert relocate_refs(schema, "#/a") == {"const": {"$ref": "#/x"}, "properties": {"$ref": {"$ref": "#/a"}}}


def test_parameters_pointer_maps_back_to_the_tool():
    tools = parse_tools([WEATHER, TREE], {"type": "function", "function": {"name": "plant"}}, None)
    assert tools.parameters_param("/properties/tool_calls/items/anyOf/0/properties/arguments/properties/root") \
        == ("tools[1].function.parameters", "/properties/root")
    assert tools.parameters_param("/properties/tool_calls") is None


# ---------------------------------------------------------------- the prompt
def test_generic_rendering_echoes_calls_as_the_grammar_writes_them():
    tools = parse_tools([WEATHER], None, None)
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Oslo?"),
                ChatMessage("assistant", "", (ToolCallRecord("call_1", "get_weather", '{"city":"Oslo"}'),)),
                ChatMessage("tool", "cold", tool_call_id="call_1")]
    turns = plain_turns(messages, tools)
    assert [t.role for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[0].content.startswith("Be brief.\n\nYou can call these functions:\n[{\"name\":\"get_weather\"")
    assert turns[2].content == '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'
    assert turns[2].content == calls_text([("get_weather", '{"city":"Oslo"}')])
    assert turns[3].content == "Result of call call_1:\ncold"
    # Deterministic, and turn 1's prompt is a prefix of turn 2's (what the prefix cache needs).
    first = "".join(t for t, _ in gemma_segments(plain_turns(messages[:2], tools)))
    second = "".join(t for t, _ in gemma_segments(turns))
    assert second.startswith(first) and first == "".join(t for t, _ in gemma_segments(plain_turns(messages[:2], tools)))


class _Chars:
    def tokenize(self, text, *, add_bos=True, parse_special=False):
        return [ord(c) for c in text]


TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
    "{% for m in messages %}<{{ m.role }}>"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }} {{ c.function.arguments | tojson }}"
    "</call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "{% if m.role == 'tool' %}[{{ m.tool_call_id }}]{% endif %}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_that_handles_tools_is_rendered_with_jinja():
    assert handles_tools(TOOL_TEMPLATE) and not handles_tools("{{ messages[0].content }}")
    jinja = JinjaChat(TOOL_TEMPLATE, bos_token="<s>", eos_token="</s>")
    syntax = derive(jinja)
    assert syntax is not None and (syntax.call_head, syntax.name_to_args, syntax.call_tail) == ("<call>", " ", "</call>")
    formatter = ChatFormatter("jinja", _Chars(), jinja=jinja, tool_syntax=syntax)
    tools = parse_tools([WEATHER], None, None, syntax)
    messages = [ChatMessage("user", "Oslo?"),
                ChatMessage("assistant", "", (ToolCallRecord("c1", "get_weather", '{"city": "Oslo"}'),)),
                ChatMessage("tool", "cold", tool_call_id="c1")]
    text = "".join(map(chr, formatter.render(messages, tools).token_ids))
    assert text.startswith('<s><tools>[{"type": "function", "function": {"name": "get_weather"')
    assert text.endswith('<user>Oslo?</user><assistant><call>get_weather {"city": "Oslo"}</call></assistant>'
                         "<tool>cold[c1]</tool><assistant>")
    # In the generic format the template sees plain turns: the calls document and a result turn.
    generic = ChatFormatter("jinja", _Chars(), jinja=jinja)
    text = "".join(map(chr, generic.render(messages, parse_tools([WEATHER], None, None)).token_ids))
    assert text.startswith("<s><system>You can call these functions:") and "<tools>" not in text
    assert '<assistant>{"tool_calls":[{"name":"get_weather","arguments":{"city": "Oslo"}}]}</assistant>' in text


def test_template_exceptions_and_the_sandbox():
    with pytest.raises(BadRequest, match="no tools here"):
        JinjaChat("{{ raise_exception('no tools here') }}").render([ChatMessage("user", "x")], None)
    with pytest.raises(Exception):  # the immutable sandbox: no mutation of what the template is given
        JinjaChat("{% set _ = messages.append(1) %}").render([ChatMessage("user", "x")], None)
    with pytest.raises(Exception):  # nor access to Python internals
        JinjaChat("{{ messages.__class__.__mro__ }}").render([ChatMessage("user", "x")], None)


# ---------------------------------------------------------------- the reader
DOC = ('{"tool_calls":[{"name":"get_weather","arguments":{"city":"Os\\"lo}]","unit":"c"}},'
       '{"name":"plant","arguments":{"root":{"v":1,"kids":[{"v":2},{"v":3}]}}}]}')


@pytest.mark.parametrize("seed", range(20))
def test_streamed_fragments_join_into_the_non_streamed_arguments(seed):
    tools = parse_tools([WEATHER, TREE], "required", None)
    whole = ToolOutputReader(tools, "calls")
    whole.feed(DOC)
    expected = [(c.name, c.arguments) for c in whole.finish(stopped=True)]
    assert expected == [("get_weather", '{"city":"Os\\"lo}]","unit":"c"}'),
                        ("plant", '{"root":{"v":1,"kids":[{"v":2},{"v":3}]}}')]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(DOC)), rng.randint(1, 30)))
    pieces = [DOC[a:b] for a, b in zip([0] + cuts, cuts + [len(DOC)])]
    reader = ToolOutputReader(tools, "auto")
    events = [e for p in pieces for e in reader.feed(p)]
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "plant")]
    joined = ["".join(e.fragment for e in events if isinstance(e, Arguments) and e.index == i) for i in range(2)]
    assert list(zip([s.name for s in starts], joined)) == expected
    assert [c.id for c in reader.finish(stopped=True)] == [s.id for s in starts]
    assert len({s.id for s in starts}) == 2 and all(s.id.startswith("call_") for s in starts)


def test_auto_text_cut_calls_and_invalid_arguments():
    tools = parse_tools([WEATHER], None, None)
    reader = ToolOutputReader(tools, "auto")
    assert reader.feed("It is") == [Text("It is")] and reader.feed(" {x}") == [Text(" {x}")]
    assert reader.finish(stopped=True) is None and reader.content() == "It is {x}"
    cut = ToolOutputReader(tools, "auto")
    cut.feed('{"tool_calls":[{"name":"get_weather","arguments":{"ci')
    assert cut.finish(stopped=False) is None  # a call cut short is never returned
    bad = ToolOutputReader(tools, "calls")
    bad.feed('{"tool_calls":[{"name":"get_weather","arguments":{"unit":"c"}}]}')  # city is required
    with pytest.raises(InternalError, match="not valid"):
        bad.finish(stopped=True)
    with pytest.raises(InternalError, match="calls format"):
        ToolOutputReader(tools, "calls").feed('{"tool_calls":[{"nam":')


# ---------------------------------------------------------------- the triggered grammar
def _tokens(text: bytes) -> list[int]:
    return [VOCAB.token_bytes.index(bytes([b])) for b in text]


def test_triggered_grammar_text_or_a_complete_document():
    schema = parse_tools([WEATHER], "required", None).calls_schema()
    grammar = compile_grammar(schema, VOCAB)
    needed = grammar.matcher().min_tokens_to_complete()
    brace = VOCAB.token_bytes.index(b"{")
    text = TriggeredMatcher(grammar.matcher())
    mask = text.allowed_mask(100)
    assert mask[brace] and mask[VOCAB.token_bytes.index(b"H")] and mask[EOG]
    assert not mask[VOCAB.token_bytes.index(b"{}")]  # begins like the document, but the grammar refuses it
    assert not text.allowed_mask(needed - 1)[brace]  # too little budget left to finish a call: text only
    opening = [t for t, b in enumerate(VOCAB.token_bytes) if b.startswith(b"{")]
    assert any(text.is_allowed(t, needed) for t in opening)  # exactly enough budget: a call may begin
    assert not any(text.is_allowed(t, needed - 1) or text.allowed_mask(needed - 1)[t] for t in opening)
    text.advance(VOCAB.token_bytes.index(b"H"))
    assert text.released and text.is_complete and not text.is_finished
    call = TriggeredMatcher(grammar.matcher())
    for t in _tokens(b'{"tool_calls":[{"name":"get_weather","arguments":{"city":"x"'):
        assert call.is_allowed(t, 100)
        call.advance(t)
    assert call.in_document and not call.is_complete and not call.is_allowed(_tokens(b"!")[0], 100)
    for t in _tokens(b"}}]}"):
        call.advance(t)
    assert call.is_complete and call.is_finished
    # A token with no text decides nothing (the reader of the text could not see it): a call may follow.
    silent = TriggeredMatcher(grammar.matcher())
    textless = next(t for t, b in enumerate(VOCAB.token_bytes) if not b and t != EOG)
    silent.advance(textless)
    assert not silent.released and silent.is_allowed(brace, 100)


def test_a_template_that_does_not_compile_falls_back_to_the_generic_prompt():
    from types import SimpleNamespace

    from server.jinja_chat import jinja_for

    broken = SimpleNamespace(chat_template="{% unknown_tag %}{{ tools }}", bos_token=None, eos_token=None)
    assert jinja_for(broken) is None  # the server still loads; tools use the generic prompt
    # Hugging Face's own tag compiles, and renders its body.
    tagged = SimpleNamespace(chat_template="{% generation %}{{ messages[0].content }}{% endgeneration %}",
                             bos_token=None, eos_token=None)
    assert jinja_for(tagged).render([ChatMessage("user", "x")], None) == "x"


def test_template_code_errors_over_the_messages_are_a_400():
    with pytest.raises(BadRequest, match="refused these messages"):
        JinjaChat("{{ messages[0].content + 1 }}{{ tools }}").render([ChatMessage("user", "x")], None)
    with pytest.raises(BadRequest, match="refused these messages"):
        JinjaChat("{{ (messages | length) / 0 }}{{ tools }}").render([ChatMessage("user", "x")], None)
