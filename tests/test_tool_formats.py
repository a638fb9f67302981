"""Tool calls in each model's own syntax, on real templates (tests/templates, LICENSES.md there):
the rendering is Hugging Face's byte for byte, the syntax derived from it is the family's, the
grammar writes only calls of that syntax with valid arguments (required, named, auto with its
opening), and the reader parses them, streamed or whole. Token tables come from the vocab-only
GGUFs llama.cpp vendors (the llama-cpp-python sdist), no weights: the walks below sample uniformly
among the tokens the grammar allows, a random model at the grammar's level."""
from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest

from bench.llama_vocab import VocabUnavailable, vocab_path
from engine.intake import Intake
from engine.request import JsonAlternative, Request
from sampling.errors import InvalidParameterError
from sampling.grammar import compile_framed
from sampling.grammar.either import EitherMatcher
from sampling.grammar.trigger import TriggeredMatcher
from sampling.vocabulary import TokenVocabulary
from server.chat_format import ChatFormatter, ChatMessage, ToolCallRecord
from server.errors import BadRequest
from server.jinja_chat import JinjaChat, message_dict
from server.native_reader import NativeReader, reader_for, spec_reader
from server.openai_schemas import parse_chat
from server.tool_families import family, name_derived
from server.tool_reader import Text
from server.tool_syntax import derive, with_opening_token
from server.tools import parse_tools

# Every case tokenizes with a vocab-only model of llama.cpp's, which the conftest counts as a model load.
pytestmark = pytest.mark.model

TEMPLATES = Path(__file__).parent / "templates"

# template: (family, vocabulary GGUF to tokenize with, parallel calls, text before calls)
CASES = {
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", "qwen2", True, True),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", "llama-bpe", True, False),
    "ibm-granite-granite-4.0": ("hermes", "llama-bpe", True, True),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3", "llama-bpe", False, False),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3", "llama-bpe", False, False),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", "llama-spm", True, False),
    "unsloth-mistral-Devstral-Small-2507": ("mistral", "llama-spm", True, True),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek", "deepseek-llm", True, True),
    "meetkai-functionary-medium-v3.1": ("functionary", "llama-bpe", True, True),
    "MiniMax-M1": ("minimax", "qwen2", True, False),
    "moonshotai-Kimi-K2": ("kimi", "qwen2", False, True),
    "unsloth-Apriel-1.5": ("apriel", "llama-spm", True, True),
}

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time now", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["zone"]}}}


_MODELS: dict[str, object] = {}


def _model(name: str):
    """A vocab-only model (tokenizer, special tokens, token bytes), loaded once per run."""
    if name not in _MODELS:
        try:
            path = vocab_path(name)  # fetched once from the registry when not on this machine
        except VocabUnavailable as exc:
            pytest.skip(f"llama.cpp's vocab GGUFs are not available: {exc}")
        from bindings.model import Model
        _MODELS[name] = Model(path, vocab_only=True)
    return _MODELS[name]


def _setup(template: str):
    fam, vocab_name, _, _ = CASES[template]
    model = _model(vocab_name)
    jinja = JinjaChat((TEMPLATES / f"{template}.jinja").read_text(), "<s>", "</s>")
    derived = derive(jinja)
    assert derived is not None
    syntax = with_opening_token(name_derived(derived), model.tokenize, model.special_tokens)
    vocab = TokenVocabulary(model.token_bytes, model.eog_tokens, model.special_tokens)
    return model, jinja, syntax, vocab


def _walk(matcher, vocab: TokenVocabulary, rng: np.random.Generator, budget: int = 120) -> str:
    """Tokens drawn uniformly among those allowed, until the grammar is complete (and then, half
    the time, on while it may still go on)."""
    out = b""
    while not matcher.is_complete or (not matcher.is_finished and rng.random() < 0.5):
        mask = matcher.allowed_mask(budget).copy()
        mask[list(vocab.eog_tokens)] = False
        if not mask.any():  # only the end may follow (the budget has no room for another call)
            assert matcher.is_complete
            break
        token = int(rng.choice(np.flatnonzero(mask)))
        matcher.advance(token)
        out += vocab.token_bytes[token]
        budget -= 1
        assert budget >= 0, "the budget always finishes the calls"
    return out.decode("utf-8")


def test_the_copied_templates_are_the_ones_tested():
    assert sorted(p.stem for p in TEMPLATES.glob("*.jinja")) == sorted(CASES)
    assert len({fam for fam, *_ in CASES.values()}) >= 8


@pytest.mark.parametrize("template", sorted(CASES))
def test_rendering_is_hugging_faces_byte_for_byte(template):
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    source = (TEMPLATES / f"{template}.jinja").read_text()
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Oslo?"),
                ChatMessage("assistant", "", (ToolCallRecord("a1b2c3d4e", "get_weather", '{"city": "Oslo", "unit": "c"}'),)),
                ChatMessage("tool", "cold", tool_call_id="a1b2c3d4e"), ChatMessage("user", "Thanks.")]
    tools = parse_tools([WEATHER, TIME], None, None)
    rendered = 0
    for conversation, declared in ((messages, tools), (messages[1:4], tools), (messages[:2], None), (messages[1:2], None)):
        try:
            ours: str | None = JinjaChat(source, "<s>", "</s>").render(conversation, declared)
        except BadRequest:  # the template's own refusal (raise_exception, or code that cannot take it)
            ours = None
        dicts = [message_dict(m) for m in conversation]
        schemas = None if declared is None else [WEATHER, TIME]
        try:
            theirs = chat_template_utils.render_jinja_template([dicts], tools=schemas, chat_template=source,
                                                                add_generation_prompt=True, bos_token="<s>",
                                                                eos_token="</s>")
            theirs = theirs[0] if isinstance(theirs, tuple) else theirs
            theirs = theirs[0] if isinstance(theirs, list) else theirs
        except Exception:
            theirs = None
        assert ours == theirs
        rendered += ours is not None
    assert rendered >= 2


@pytest.mark.parametrize("template", sorted(CASES))
def test_the_derived_syntax_is_the_familys(template):
    fam, _, parallel, text_before = CASES[template]
    _, _, syntax, _ = _setup(template)
    assert syntax.family == fam and syntax.source == "derived"
    assert family(fam).matches(syntax)
    assert (syntax.parallel, syntax.text_before) == (parallel, text_before)


@pytest.mark.parametrize("template", sorted(CASES))
def test_required_and_named_answers_are_valid_calls_in_the_native_syntax(template):
    _, _, syntax, vocab = _setup(template)
    rng = np.random.default_rng(7)
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})):
        tools = parse_tools([WEATHER, TIME], choice, None, syntax)
        grammar = compile_framed(tools.tool_frame(), vocab)
        for _ in range(4):
            text = _walk(grammar.matcher(), vocab, rng)
            assert text.startswith(syntax.start)
            reader = reader_for(tools, "calls")
            reader.feed(text)
            calls = reader.finish(stopped=True)  # parses, rebuilds the text, validates the arguments
            assert calls and {c.name for c in calls} <= names
            assert len(calls) == 1 or (syntax.parallel and choice == "required")


@pytest.mark.parametrize("template", sorted(CASES))
def test_auto_opens_calls_with_the_native_opening_and_otherwise_is_text(template):
    model, _, syntax, vocab = _setup(template)
    tools = parse_tools([WEATHER, TIME], "auto", None, syntax)
    grammar = compile_framed(tools.tool_frame(), vocab)
    opened = TriggeredMatcher(grammar.matcher(), syntax.opening_token)
    # the opening's first character as a token of its own
    first = next(t for t, b in enumerate(vocab.token_bytes) if b == syntax.start[:1].encode() and t not in vocab.special_tokens)
    assert opened.is_allowed(first, 200)
    opened.advance(first)
    assert opened.in_document
    text = vocab.token_bytes[first].decode() + _walk(opened, vocab, np.random.default_rng(3))
    reader = reader_for(tools, "auto")
    reader.feed(text)
    assert reader.is_calls and reader.finish(stopped=True)
    words = TriggeredMatcher(grammar.matcher(), syntax.opening_token)
    hello = model.tokenize("Hello", add_bos=False)[0]
    words.advance(hello)
    assert words.released
    reader = reader_for(tools, "auto")
    reader.feed("Hello there")
    assert reader.finish(stopped=True) is None and reader.content() == "Hello there"


def _auto_matcher(grammar, frame) -> TriggeredMatcher:
    """The matcher the engine makes for an `auto` turn (engine/intake.py)."""
    return TriggeredMatcher(grammar.matcher(), frame.opening_token, after_text=frame.after_text,
                            marker=frame.marker.encode())


@pytest.mark.parametrize("template", sorted(t for t, case in CASES.items() if case[3]))
def test_auto_calls_may_follow_text_where_the_family_writes_text_before_them(template):
    model, _, syntax, vocab = _setup(template)
    tools = parse_tools([WEATHER, TIME], "auto", None, syntax)
    frame = tools.tool_frame()
    assert (frame.after_text, frame.marker) == (syntax.opening_token is None, syntax.marker)
    grammar = compile_framed(frame, vocab)
    words = "Let me check the weather."
    ids = model.tokenize(words + syntax.text_joint + syntax.start + "get_time", add_bos=False)
    matcher, answer = _auto_matcher(grammar, frame), b""
    for token in ids:  # the model's own spelling of text, then the marker and the call's start
        assert matcher.is_allowed(token, 300)
        matcher.advance(token)
        answer += vocab.token_bytes[token]
        if not frame.after_text:  # the opening is a special token: text stays text
            assert matcher.released
            return
        assert matcher.mode in ("prose", "document") and not matcher.released
        assert matcher.in_document == (syntax.marker.encode() in answer)
    assert matcher.in_document
    text = answer.decode() + _walk(matcher, vocab, np.random.default_rng(5), 300 - len(ids))
    before = text[:text.index(syntax.marker)].removesuffix(syntax.text_joint)
    assert words in before
    rng = random.Random(template)
    for _ in range(4):  # the reader finds the calls where the grammar opened them, in any pieces
        reader, events = reader_for(tools, "auto"), []
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 20)))
        for a, b in zip([0] + cuts, cuts + [len(text)]):
            events += reader.feed(text[a:b])
        calls = reader.finish(stopped=True)
        assert calls and calls[0].name == "get_time" and reader.content() == before
        assert "".join(e.text for e in events if isinstance(e, Text)) == before


@pytest.mark.parametrize("template", sorted(t for t, case in CASES.items() if case[3]))
def test_a_token_that_completes_the_marker_must_go_on_as_the_calls_do(template):
    """A token may end the marker and carry more (`>\\n` after `<tool_call`): allowed only when
    the marker and that rest begin calls the budget can still finish."""
    _, _, syntax, vocab = _setup(template)
    frame = parse_tools([WEATHER, TIME], "auto", None, syntax).tool_frame()
    if not frame.after_text:
        pytest.skip("the calls open with a special token in this vocabulary: text stays text")
    grammar = compile_framed(frame, vocab)
    marker, start = syntax.marker.encode(), syntax.start.encode()
    matcher = _auto_matcher(grammar, frame)
    matcher.advance_bytes(b"Checking. " + marker[:-1])
    assert matcher.mode == "prose"
    heads = [(syntax.start + name + syntax.name_to_args).encode() for name in ("get_weather", "get_time")]
    enders = [t for t, b in enumerate(vocab.token_bytes)  # short enough to be judged by the heads alone
              if b[:1] == marker[-1:] and len(marker) + len(b) - 1 <= min(map(len, heads))
              and t not in vocab.special_tokens]
    verdicts = {t: matcher.is_allowed(t, 300) for t in enders}
    assert verdicts == {t: any(h.startswith(marker + vocab.token_bytes[t][1:]) for h in heads) for t in enders}
    assert any(verdicts.values()) and not all(verdicts.values())
    mask = matcher.allowed_mask(300)
    assert np.flatnonzero(~mask).tolist() == [t for t in range(mask.size) if not matcher.is_allowed(t, 300)]
    assert not any(matcher.is_allowed(t, 3) for t in enders)  # no call fits in what is left
    plain = next(t for t, b in enumerate(vocab.token_bytes) if b == b"a")
    assert matcher.is_allowed(plain, 3) and matcher.mode == "prose"


def test_text_that_only_looks_like_the_start_of_calls_is_held_then_given_back():
    _, _, syntax, _ = _setup("Qwen-Qwen2.5-7B-Instruct")
    tools = parse_tools([WEATHER, TIME], "auto", None, syntax)
    reader = reader_for(tools, "auto")
    pieces = ["Use", " the <tool", "_ca"]
    events = [e for p in pieces for e in reader.feed(p)]
    assert "".join(e.text for e in events) == "Use the "  # "<tool_ca" may yet open calls
    assert [e.text for e in reader.flush()] == ["<tool_ca"]
    assert reader.finish(stopped=True) is None and reader.content() == "Use the <tool_ca"
    # two calls after text, the template's "\n" between them dropped from the content
    answer = ("Sure.\n" + syntax.calls_text([("get_weather", '{"city": "Oslo", "unit": "c"}', ""),
                                             ("get_time", '{"zone": "CET"}', "")]))
    reader = reader_for(tools, "auto")
    events = [e for ch in answer for e in reader.feed(ch)]
    calls = reader.finish(stopped=True)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo", "unit": "c"}),
                                                                 ("get_time", {"zone": "CET"})]
    assert reader.content() == "Sure." and "".join(e.text for e in events if isinstance(e, Text)) == "Sure."


@pytest.mark.parametrize("template", sorted(CASES))
def test_a_hand_written_answer_parses_streamed_as_whole(template):
    _, _, syntax, _ = _setup(template)
    tools = parse_tools([WEATHER, TIME], "required", None, syntax)
    calls = [("get_weather", '{"city": "Os\\"lo}", "unit": "c"}', "a1b2c3d4e"), ("get_time", '{"zone": "CET"}', "x9y8z7w6v")]
    calls = calls if syntax.parallel else calls[:1]
    text = syntax.calls_text(calls)
    whole = reader_for(tools, "calls")
    whole.feed(text)
    got = [(c.name, c.arguments) for c in whole.finish(stopped=True)]
    assert got == [(n, a) for n, a, _ in calls]
    rng = random.Random(template)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 25))))
        streamed = reader_for(tools, "calls")
        for a, b in zip([0] + cuts, cuts + [len(text)]):
            streamed.feed(text[a:b])
        assert [(c.name, c.arguments) for c in streamed.finish(stopped=True)] == got
    if syntax.calls_after_text:  # text first, as the template writes it, under auto
        answer = "Let me look that up." + syntax.text_joint + text
        for _ in range(5):
            cuts = sorted(rng.sample(range(1, len(answer)), rng.randint(1, 25)))
            streamed = reader_for(tools, "auto")
            for a, b in zip([0] + cuts, cuts + [len(answer)]):
                streamed.feed(answer[a:b])
            assert [(c.name, c.arguments) for c in streamed.finish(stopped=True)] == got
            assert streamed.content() == "Let me look that up."


@pytest.mark.parametrize("template", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
                                      "mistralai-Mistral-Nemo-Instruct-2407"])
def test_turn_two_starts_with_turn_one_and_echoes_the_call_as_the_template_renders_it(template):
    model, jinja, syntax, _ = _setup(template)
    formatter = ChatFormatter("jinja", model, jinja=jinja, tool_syntax=syntax)
    tools = parse_tools([WEATHER], "auto", None, syntax)
    turn1 = [ChatMessage("user", "Weather in Oslo?")]
    call = ToolCallRecord("a1b2c3d4e", "get_weather", '{"city": "Oslo", "unit": "c"}')
    turn2 = turn1 + [ChatMessage("assistant", "", (call,)), ChatMessage("tool", "cold", tool_call_id=call.id)]
    first, second = formatter.render(turn1, tools).token_ids, formatter.render(turn2, tools).token_ids
    # The prefix cache serves turn 1's prompt (but its last token, which these text-only markers
    # may merge with what follows: in the models' own vocabularies they are special tokens).
    assert second[:len(first) - 1] == first[:-1]
    text = jinja.render(turn2, tools)
    assert syntax.call_text("get_weather", '{"city": "Oslo", "unit": "c"}', call.id) in text


def test_a_special_token_opening_is_forced_for_required_and_a_trigger_for_auto():
    """Mistral's own vocabulary has `[TOOL_CALLS]` as one control token (no text)."""
    jinja = JinjaChat((TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text(), "<s>", "</s>")
    opener = 7

    class Tokenizer:
        def tokenize(self, text, *, add_bos=True, parse_special=False):
            if parse_special and text.startswith("[TOOL_CALLS]"):
                return [opener] + [ord(c) + 100 for c in text[len("[TOOL_CALLS]"):]]
            return [ord(c) + 100 for c in text]

    syntax = with_opening_token(name_derived(derive(jinja)), Tokenizer().tokenize, frozenset({opener}))
    assert (syntax.opening_token, syntax.opening, syntax.start) == (opener, "[", '[{"name": "')
    formatter = ChatFormatter("jinja", Tokenizer(), jinja=jinja, tool_syntax=syntax)
    user = [ChatMessage("user", "Oslo?")]
    assert formatter.render(user, parse_tools([WEATHER], "required", None, syntax)).token_ids[-1] == opener
    assert formatter.render(user, parse_tools([WEATHER], "auto", None, syntax)).token_ids[-1] != opener
    vocab = TokenVocabulary(tuple([b""] * 10 + [bytes([b]) for b in range(256)]), frozenset({0}), frozenset({opener}))
    grammar = compile_framed(parse_tools([WEATHER], "auto", None, syntax).tool_frame(), vocab)
    auto = TriggeredMatcher(grammar.matcher(), opener)
    assert auto.is_allowed(opener, 200) and not auto.is_allowed(opener, 1)  # only if a call still fits
    auto.advance(opener)
    assert auto.in_document and auto.is_allowed(10 + ord("["), 200) and not auto.is_allowed(10 + ord("H"), 200)
    reader = NativeReader(parse_tools([WEATHER], "required", None, syntax), "calls")
    reader.feed('[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}, "id": "abcdefghi"}]')
    [call] = reader.finish(stopped=True)
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo", "unit": "c"})
    assert len(call.id) == 9 and call.id.isalnum()  # the template refuses any other id when it is echoed


# A format beside tools under "auto": its first member is "name", as Llama 3's calls begin.
FORECAST = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                             "celsius": {"type": "integer", "minimum": -60, "maximum": 60}},
            "required": ["name", "celsius"], "additionalProperties": False}


def _beside_a_format(syntax):
    """The spec and engine Request of an auto turn with two tools and the FORECAST format."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Oslo?"}], "tools": [WEATHER, TIME],
            "response_format": {"type": "json_schema", "json_schema": {"name": "forecast", "schema": FORECAST}}}
    spec = parse_chat(body, n_ctx=4096, tool_syntax=syntax).specs[0]
    return spec, replace(spec, prompt=[1]).request("r")


def _read(spec, text: str, rng: random.Random):
    """The answer fed to its reader in random pieces: (calls or None, the text it read as content)."""
    reader = spec_reader(spec)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        reader.feed(text[a:b])
    return reader.finish(stopped=True), reader.content()


def _check_answer(spec, syntax, text: str, rng: random.Random) -> str:
    calls, content = _read(spec, text, rng)
    if calls:
        assert text.startswith(syntax.start) and content == ""
        assert {c.name for c in calls} <= {"get_weather", "get_time"}
        return "calls"
    assert not text.startswith(syntax.start) and content == text
    jsonschema.validate(json.loads(text), FORECAST)
    return "format"


@pytest.mark.parametrize("template", sorted(CASES))
def test_auto_beside_a_format_is_native_calls_or_the_formats_document(template):
    """The calls alternative is the framed grammar, opened by the syntax's start; anything else
    is the format's document, never free text; the reader tells them apart as the grammar does."""
    model, _, syntax, vocab = _setup(template)
    spec, request = _beside_a_format(syntax)
    assert request.tool_frame == spec.tools.tool_frame() and request.json_schema is None
    assert request.json_alternative.opening == syntax.start and not request.json_or_text
    intake = Intake(model, 4096, lambda _: None)
    rng, pieces = np.random.default_rng(11), random.Random(template)
    kinds = set()
    for _ in range(12):
        matcher = intake._grammar_matcher(request)
        assert isinstance(matcher, EitherMatcher) and matcher.which is None
        kinds.add(_check_answer(spec, syntax, _walk(matcher, vocab, rng), pieces))
    # Where the first token tells them apart, uniform walks find both (Llama 3's calls and the
    # format both open with `{"name":`, and part there: the written ones below).
    assert kinds == {"calls", "format"} or syntax.start.startswith('{"name":')
    # Written on purpose: the calls' start, or a format document that shares a prefix with it.
    for prefix, kind in ((syntax.start, "calls"), ('{"name":"', "format")):
        matcher = intake._grammar_matcher(request)
        matcher.advance_bytes(prefix.encode())
        assert matcher.which == ("first" if kind == "calls" else "second")
        assert matcher.json_document == (kind == "format")
        assert _check_answer(spec, syntax, prefix + _walk(matcher, vocab, rng), pieces) == kind


def test_a_format_document_may_not_begin_as_the_calls_do():
    """Llama 3's calls begin `{"name": "`, as a FORECAST document may: after `{"name":` both are
    possible, and a token that completes the calls' start is the calls', never the format's."""
    model, _, syntax, vocab = _setup("meta-llama-Llama-3.1-8B-Instruct")
    _, request = _beside_a_format(syntax)
    matcher = Intake(model, 4096, lambda _: None)._grammar_matcher(request)
    matcher.advance_bytes(b'{"name":')
    assert matcher.which is None
    completing = [t for t in np.flatnonzero(matcher.allowed_mask(200)).tolist() if vocab.token_bytes[t].startswith(b' "')]
    assert completing
    for token in completing:
        twin = matcher.fork()
        twin.advance(token)
        assert twin.which == "first"
    document = matcher.fork()
    document.advance_bytes(b'"')
    assert document.which == "second"


def test_a_special_token_opens_the_calls_beside_a_format_too():
    """Mistral's `[TOOL_CALLS]` (one control token) opens the calls; `[` as text does too; `{`
    is the format's; the token is a first token only, and only while a call still fits."""
    jinja = JinjaChat((TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text(), "<s>", "</s>")
    opener = 7

    def tokenize(text, *, add_bos=True, parse_special=False):
        if parse_special and text.startswith("[TOOL_CALLS]"):
            return [opener] + [ord(c) + 10 for c in text[len("[TOOL_CALLS]"):]]
        return [ord(c) + 10 for c in text]

    syntax = with_opening_token(name_derived(derive(jinja)), tokenize, frozenset({opener}))
    model = SimpleNamespace(token_bytes=tuple([b""] * 10 + [bytes([b]) for b in range(256)]),
                            eog_tokens=frozenset({0}), special_tokens=frozenset({opener}))
    vocab = TokenVocabulary(model.token_bytes, model.eog_tokens, model.special_tokens)
    spec, request = _beside_a_format(syntax)
    assert request.tool_frame.opening_token == opener and request.json_alternative.opening == '[{"name": "'
    intake = Intake(model, 4096, lambda _: None)
    matcher = intake._grammar_matcher(request)
    needed = compile_framed(request.tool_frame, vocab).matcher().min_tokens_to_complete()
    assert matcher.is_allowed(opener, 200) and matcher.allowed_mask(200)[opener]
    assert not matcher.is_allowed(opener, needed) and matcher.is_allowed(opener, needed + 1)
    assert matcher.forced_bytes() == (b"", False)
    by_text = matcher.fork()
    by_text.advance(10 + ord("["))
    assert by_text.which == "first"
    document = matcher.fork()
    document.advance(10 + ord("{"))
    assert document.which == "second" and not document.is_allowed(opener, 200)
    with pytest.raises(ValueError):
        document.advance(opener)
    matcher.advance(opener)
    assert matcher.which == "first" and not matcher.json_document
    assert matcher.is_allowed(10 + ord("["), 200) and not matcher.is_allowed(10 + ord("{"), 200)
    text = _walk(matcher, vocab, np.random.default_rng(5))  # the token has no text: the reader reads this
    assert _check_answer(spec, syntax, text, random.Random(1)) == "calls"


def test_the_alternatives_opening_must_be_how_the_frames_calls_begin():
    tools = parse_tools([WEATHER], "auto", None, family("hermes").syntax)
    Request([1], format="json", tool_frame=tools.tool_frame(), json_alternative=JsonAlternative(None, "<tool_call>"))
    with pytest.raises(InvalidParameterError, match="every call of the tool_frame"):
        Request([1], format="json", tool_frame=tools.tool_frame(), json_alternative=JsonAlternative(None, '{"tool_calls":['))
