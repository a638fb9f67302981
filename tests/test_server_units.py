"""Unit tests of the server's pieces that need no model: validation, chat rendering, SSE."""
from __future__ import annotations

import pytest

from server.chat_format import ChatFormatter, ChatMessage, detect_style, gemma_segments, parse_messages
from server.errors import BadRequest, NotImplementedFeature
from server.openai_schemas import parse_chat, parse_completion
from server.schemas import parse_generate
from server.sse import encode_event
from server.structured import from_response_format


def test_generate_defaults_follow_the_documented_values():
    spec = parse_generate({"prompt": "hi"}, n_ctx=4096)
    assert (spec.max_tokens, spec.temperature, spec.top_p, spec.top_k) == (512, 0.7, 0.9, 40)
    assert spec.priority == "batch" and spec.stop == () and spec.seed is None and not spec.stream
    assert spec.structured is None


def test_generate_accepts_every_documented_field():
    spec = parse_generate(
        {"prompt": "hi", "priority": "interactive", "format": "raw", "max_tokens": 8, "temperature": 0,
         "top_p": 1, "top_k": 0, "stop": "\n", "seed": 7, "stream": True},
        n_ctx=4096,
    )
    assert spec.stop == ("\n",) and spec.seed == 7 and spec.priority == "interactive" and spec.stream
    assert spec.engine_options()["temperature"] == 0.0


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "'prompt' is required"),
        ({"prompt": 3}, "'prompt' must be a string, got a number"),
        ({"prompt": " "}, "'prompt' must not be empty"),
        ({"prompt": "x", "max_tokens": 5000}, "'max_tokens' must be <= 4096"),
        ({"prompt": "x", "max_tokens": True}, "'max_tokens' must be an integer, got a boolean"),
        ({"prompt": "x", "top_k": 2.5}, "'top_k' must be an integer"),
        ({"prompt": "x", "top_p": 0}, "'top_p' must be greater than 0.0"),
        ({"prompt": "x", "temperature": 2.5}, "'temperature' must be <= 2.0"),
        ({"prompt": "x", "stop": [1]}, "'stop[0]' must be a string"),
        ({"prompt": "x", "priority": "now"}, "'priority' must be one of 'interactive', 'batch'"),
        ({"prompt": "x", "json_schema": {"type": "object"}}, "'json_schema' needs \"format\": \"json\""),
        ({"prompt": "x", "format": "json", "json_schema": {"type": 5}}, "not a valid JSON Schema"),
        ({"prompt": "x", "colour": 1}, "unknown field(s): 'colour'"),
    ],
)
def test_generate_rejections_name_the_problem(body, message):
    with pytest.raises(BadRequest) as info:
        parse_generate(body, n_ctx=4096)
    assert message in info.value.message


def test_float_that_is_an_integer_is_accepted_as_one():
    assert parse_generate({"prompt": "x", "max_tokens": 16.0}, n_ctx=4096).max_tokens == 16


def test_completion_prompt_forms_and_unsupported_options():
    assert parse_completion({"model": "m", "prompt": ["hi"]}, n_ctx=64).spec.prompt == "hi"
    assert parse_completion({"model": "m", "prompt": [2, 3]}, n_ctx=64).spec.prompt == [2, 3]
    assert parse_completion({"model": "m", "prompt": "hi"}, n_ctx=64).spec.max_tokens == 16
    for extra in ({"n": 2}, {"logprobs": 2}, {"echo": True}, {"presence_penalty": 0.5}, {"prompt": ["a", "b"]}):
        with pytest.raises(NotImplementedFeature):
            parse_completion({"model": "m", "prompt": "hi", **extra}, n_ctx=64)
    with pytest.raises(BadRequest, match="stream_options"):
        parse_completion({"model": "m", "prompt": "hi", "stream_options": {"include_usage": True}}, n_ctx=64)


def test_chat_max_completion_tokens_wins_and_tools_are_refused():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat({**body, "max_completion_tokens": 9, "max_tokens": 3}, n_ctx=64).spec.max_tokens == 9
    assert parse_chat(body, n_ctx=1024).spec.max_tokens == 512
    with pytest.raises(NotImplementedFeature):
        parse_chat({**body, "tools": [{"type": "function"}]}, n_ctx=64)


def test_response_format_parsing():
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}).engine_options() == {"format": "json", "json_schema": None}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert got.schema == schema and got.engine_options() == {"format": "json", "json_schema": schema}
    with pytest.raises(BadRequest, match="not a valid JSON Schema"):
        from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})
    with pytest.raises(BadRequest, match="'response_format.type'"):
        from_response_format({"type": "yaml"})


def test_messages_validation():
    assert parse_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]) \
        == [ChatMessage("user", "ab")]
    with pytest.raises(BadRequest, match="non-empty list"):
        parse_messages([])
    with pytest.raises(BadRequest, match=r"messages\[0\].role"):
        parse_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(BadRequest, match="text only"):
        parse_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(BadRequest, match="at least one user message"):
        parse_messages([{"role": "system", "content": "x"}])


def test_gemma_segments_fold_system_into_first_user_turn():
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"),
                ChatMessage("assistant", "Hello"), ChatMessage("user", "Bye")]
    text = "".join(t for t, _ in gemma_segments(messages))
    assert text == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    assert all(special == t.startswith("<") for t, special in gemma_segments(messages) if t)


class _RecordingTokenizer:
    def __init__(self):
        self.calls = []

    def tokenize(self, text, *, add_bos=True, parse_special=False):
        self.calls.append((text, add_bos, parse_special))
        return [len(text)]


def test_user_text_is_never_parsed_as_special_tokens():
    tokenizer = _RecordingTokenizer()
    ChatFormatter("gemma", tokenizer).render([ChatMessage("user", "<end_of_turn> sneaky")])
    assert ("<end_of_turn> sneaky", False, False) in tokenizer.calls
    assert tokenizer.calls[0][1] is True  # BOS only before the first piece
    assert not any(add_bos for _, add_bos, _ in tokenizer.calls[1:])


def test_transcript_fallback_adds_a_user_stop():
    rendered = ChatFormatter("transcript", _RecordingTokenizer()).render([ChatMessage("user", "hi")])
    assert rendered.extra_stops == ("\nuser:",)


class _CharTokenizer:
    def tokenize(self, text, *, add_bos=True, parse_special=False):
        return [ord(c) for c in text]


def test_style_detection():
    assert detect_style("gemma3 270M Q4_K - Medium", None, _CharTokenizer()) == "gemma"
    assert detect_style("llama 8B", "{{ messages }}", _CharTokenizer()) == "template"
    assert detect_style("llama 8B", None, _CharTokenizer()) == "transcript"
    assert detect_style("unnamed", None, _RecordingTokenizer()) == "gemma"  # markers are single tokens


def test_sse_encoding():
    assert encode_event({"a": "é"}, event="delta") == 'event: delta\ndata: {"a":"é"}\n\n'.encode()
    assert encode_event("[DONE]") == b"data: [DONE]\n\n"
    assert encode_event("two\nlines") == b"data: two\ndata: lines\n\n"
