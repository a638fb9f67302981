"""Unit tests of the server's pieces that need no model: validation, chat rendering, SSE."""
from __future__ import annotations

import pytest

from engine import Priority, Request, SamplingParams
from server.chat_format import ChatFormatter, ChatMessage, RenderedChat, detect_style, gemma_segments, parse_messages
from server.errors import BadRequest, NotImplementedFeature
from server.openai_schemas import parse_chat, parse_completion
from server.schemas import parse_generate
from server.sse import encode_event
from server.logprobs import chat_logprobs, completion_logprobs, generate_logprobs
from server.structured import StructuredOutput, from_response_format


def test_generate_defaults_follow_the_documented_values():
    spec = parse_generate({"prompt": "hi"}, n_ctx=4096)[0]
    assert (spec.max_tokens, spec.temperature, spec.top_p, spec.top_k) == (512, 0.7, 0.9, 40)
    assert spec.priority == "batch" and spec.stop == () and spec.seed is None and not spec.stream
    assert spec.structured is None


def test_generate_accepts_every_documented_field():
    spec = parse_generate(
        {"prompt": "hi", "priority": "interactive", "format": "raw", "max_tokens": 8, "temperature": 0,
         "top_p": 1, "top_k": 0, "stop": "\n", "seed": 7, "stream": True},
        n_ctx=4096,
    )[0]
    assert spec.stop == ("\n",) and spec.seed == 7 and spec.priority == "interactive" and spec.stream
    assert spec.request("r").sampling.temperature == 0.0


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
        ({"prompt": "x", "format": "raw", "json_schema": {"type": "object"}}, "drop \"format\": \"raw\""),
        ({"prompt": "x", "format": "json", "json_schema": {"type": 5}}, "not a valid JSON Schema"),
        ({"prompt": "x", "colour": 1}, "unknown field(s): 'colour'"),
    ],
)
def test_generate_rejections_name_the_problem(body, message):
    with pytest.raises(BadRequest) as info:
        parse_generate(body, n_ctx=4096)[0]
    assert message in info.value.message


def test_float_that_is_an_integer_is_accepted_as_one():
    assert parse_generate({"prompt": "x", "max_tokens": 16.0}, n_ctx=4096)[0].max_tokens == 16


def test_completion_prompt_forms_and_unsupported_options():
    def prompts(value):
        return [spec.prompt for spec in parse_completion({"model": "m", "prompt": value}, n_ctx=64).specs]

    assert prompts(["hi"]) == ["hi"] and prompts([2, 3]) == [[2, 3]] and prompts("hi") == ["hi"]
    assert prompts(["a", "b"]) == ["a", "b"] and prompts([[2, 3], [4]]) == [[2, 3], [4]]
    assert prompts(["a", [5, 6]]) == ["a", [5, 6]]
    for bad in ([], ["a", ""], [[]], ["a", 3], [True], [[1, -2]], ["x"] * 257):
        with pytest.raises(BadRequest):
            prompts(bad)
    assert parse_completion({"model": "m", "prompt": "hi"}, n_ctx=64).specs[0].max_tokens == 16
    for extra in ({"best_of": 3}, {"suffix": "x"}):
        with pytest.raises(NotImplementedFeature):
            parse_completion({"model": "m", "prompt": "hi", **extra}, n_ctx=64)
    with pytest.raises(BadRequest, match="stream_options"):
        parse_completion({"model": "m", "prompt": "hi", "stream_options": {"include_usage": True}}, n_ctx=64)


def test_n_choices_get_derived_seeds_and_must_fit_the_cache():
    specs = parse_completion({"model": "m", "prompt": ["a", "b"], "n": 3, "seed": 7, "max_tokens": 4},
                             n_ctx=64).specs
    assert [s.prompt for s in specs] == ["a"] * 3 + ["b"] * 3
    assert specs[0].seed == specs[3].seed == 7 and len({s.seed for s in specs[:3]}) == 3
    again = parse_completion({"model": "m", "prompt": "a", "n": 3, "seed": 7, "max_tokens": 4}, n_ctx=64).specs
    assert [s.seed for s in again] == [s.seed for s in specs[:3]]  # reproducible
    unseeded = parse_completion({"model": "m", "prompt": "a", "n": 2, "max_tokens": 4}, n_ctx=64).specs
    assert [s.seed for s in unseeded] == [None, None]
    chat = parse_chat({**CHAT, "n": 2, "seed": 1, "max_tokens": 4}, n_ctx=64)
    assert len(chat.specs) == 2
    for body, code in (({"n": 5, "max_tokens": 16}, "n_too_large"), ({"n": 17}, None),
                       ({"n": 2, "prompt": ["x"] * 129}, "too_many_prompts")):
        with pytest.raises(BadRequest) as info:
            parse_completion({"model": "m", "prompt": "a", "max_tokens": 1, **body}, n_ctx=64)
        assert code is None or info.value.code == code


def test_chat_max_completion_tokens_wins_and_legacy_functions_are_refused():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat({**body, "max_completion_tokens": 9, "max_tokens": 3}, n_ctx=64).specs[0].max_tokens == 9
    assert parse_chat(body, n_ctx=1024).specs[0].max_tokens == 512
    with pytest.raises(NotImplementedFeature):
        parse_chat({**body, "functions": [{"name": "f"}]}, n_ctx=64)
    with pytest.raises(BadRequest, match="tools\\[0\\]"):  # tools are accepted, this one is malformed
        parse_chat({**body, "tools": [{"type": "function"}]}, n_ctx=64)


def test_response_format_parsing():
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}) == StructuredOutput(None, source="response_format")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    got = from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert got == StructuredOutput(schema, source="response_format")
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


# ---- sampling options, logprobs and JSON output ------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_the_server_builds_the_engines_request_with_the_generate_defaults():
    request = parse_generate({"prompt": "x"}, n_ctx=64)[0].request("gen-1")
    assert isinstance(request, Request) and request.request_id == "gen-1" and request.prompt == "x"
    assert request.sampling == SamplingParams(temperature=0.7, top_p=0.9, top_k=40)
    assert (request.max_tokens, request.priority, request.format, request.logprobs) == (512, Priority.BATCH, "raw", 0)


def test_generate_sampling_extras_reach_the_engine():
    spec = parse_generate(
        {"prompt": "x", "min_p": 0.05, "repetition_penalty": 1.3, "presence_penalty": 0.5,
         "frequency_penalty": -0.5, "logit_bias": {"17": -100, "3": 2.5}, "logprobs": 3}, n_ctx=64)[0]
    request = spec.request("r")
    assert request.sampling.min_p == 0.05 and request.sampling.repetition_penalty == 1.3
    assert request.sampling.presence_penalty == 0.5 and request.sampling.frequency_penalty == -0.5
    assert request.sampling.logit_bias == ((3, 2.5), (17, -100.0))
    assert request.logprobs == 3


def test_openai_penalties_and_logit_bias_are_accepted():
    spec = parse_completion({"model": "m", "prompt": "hi", "presence_penalty": 1, "frequency_penalty": 0.5,
                             "logit_bias": {"50256": -100}}, n_ctx=64).specs[0]
    assert spec.request("r").sampling.logit_bias == ((50256, -100.0),)
    chat = parse_chat({**CHAT, "presence_penalty": -2, "logit_bias": {"1": 5}}, n_ctx=64).specs[0]
    assert chat.presence_penalty == -2.0 and chat.logit_bias == ((1, 5.0),)


@pytest.mark.parametrize(
    "bias, message",
    [
        ({"abc": 1}, "keys must be non-negative integer token ids, got 'abc'"),
        ({"-3": 1}, "keys must be non-negative integer token ids, got '-3'"),
        ({"1.5": 1}, "keys must be non-negative integer token ids"),
        ({"7": 101}, "'logit_bias[7]' must be between -100 and 100"),
        ({"7": "big"}, "'logit_bias[7]' must be a number, got a string"),
        ({"7": 1, "07": 2}, "lists token 7 twice"),
        ([1, 2], "'logit_bias' must be an object"),
        ({str(i): 1 for i in range(1025)}, "at most 1024 entries"),
    ],
)
def test_bad_logit_bias_is_400(bias, message):
    for parse, body in ((parse_generate, {"prompt": "x"}), (parse_completion, {"model": "m", "prompt": "x"}),
                        (parse_chat, CHAT)):
        with pytest.raises(BadRequest) as info:
            parse({**body, "logit_bias": bias}, n_ctx=64)
        assert message in info.value.message and info.value.param == "logit_bias"


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"presence_penalty": 2.5}, "'presence_penalty' must be <= 2.0"),
        ({"frequency_penalty": -3}, "'frequency_penalty' must be >= -2.0"),
        ({"repetition_penalty": 0}, "'repetition_penalty' must be greater than 0.0"),
        ({"min_p": 1.5}, "'min_p' must be <= 1.0"),
        ({"logprobs": 21}, "'logprobs' must be <= 20"),
        ({"logprobs": 2, "stream": True}, "'logprobs' is not supported with \"stream\": true"),
        ({"format": "json", "stop": "\n"}, "'stop' cannot be combined with JSON output"),
    ],
)
def test_generate_rejects_bad_extras(extra, message):
    with pytest.raises(BadRequest) as info:
        parse_generate({"prompt": "x", **extra}, n_ctx=64)[0]
    assert message in info.value.message


def test_openai_logprobs_fields():
    spec = parse_completion({"model": "m", "prompt": "hi", "logprobs": 0}, n_ctx=64).specs[0]
    assert spec.want_logprobs and spec.logprobs == 0 and spec.request("r").logprobs == 1
    for none in (None, False):
        assert not parse_completion({"model": "m", "prompt": "hi", "logprobs": none}, n_ctx=64).specs[0].want_logprobs
    chat = parse_chat({**CHAT, "logprobs": True, "top_logprobs": 4}, n_ctx=64)
    assert chat.specs[0].want_logprobs and chat.specs[0].request("r", RenderedChat([1], ())).logprobs == 4
    assert not parse_chat({**CHAT, "logprobs": False}, n_ctx=64).specs[0].want_logprobs
    with pytest.raises(BadRequest, match="'top_logprobs' needs"):
        parse_chat({**CHAT, "top_logprobs": 2}, n_ctx=64)
    with pytest.raises(BadRequest, match="not supported with"):
        parse_chat({**CHAT, "logprobs": True, "stream": True}, n_ctx=64)
    with pytest.raises(BadRequest, match="'logprobs' must be true or false"):
        parse_chat({**CHAT, "logprobs": 3}, n_ctx=64)


def test_json_chat_drops_the_transcript_stop_but_refuses_a_user_stop():
    from server.chat_format import RenderedChat
    rendered = RenderedChat(token_ids=[1, 2], extra_stops=("\nuser:",))
    plain = parse_chat(CHAT, n_ctx=64)
    assert plain.specs[0].request("r", rendered).stop == ("\nuser:",)
    json_chat = parse_chat({**CHAT, "response_format": {"type": "json_object"}}, n_ctx=64)
    request = json_chat.specs[0].request("r", rendered)
    assert request.stop == () and request.format == "json" and request.json_schema is None
    assert request.prompt == (1, 2) and request.sampling.temperature == 1.0  # OpenAI's default
    with pytest.raises(BadRequest, match="'stop' cannot be combined with JSON output"):
        parse_chat({**CHAT, "stop": "x", "response_format": {"type": "json_object"}}, n_ctx=64)
    with pytest.raises(BadRequest, match="strict"):
        from_response_format({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}})


class _Entry:
    def __init__(self, token, logprob, top):
        self.token, self.logprob, self.top = token, logprob, top


class _Result:
    def __init__(self, text, entries):
        self.text, self.logprobs = text, tuple(entries)


TOKEN_BYTES = (b"", b"He", b"llo", b" world", b"\xe2\x82", b"<eos>")
# "Hello" then an end-of-generation token (no text): the last entry is not part of the answer.
RESULT = _Result("Hello", [_Entry(1, -0.5, ((1, -0.5), (3, -1.5), (2, -2.0))),
                           _Entry(2, -0.1, ((2, -0.1), (1, -3.0), (3, -4.0))),
                           _Entry(5, -0.01, ((5, -0.01), (1, -5.0), (2, -6.0)))])


def test_completion_logprobs_legacy_shape():
    got = completion_logprobs(RESULT, TOKEN_BYTES, 1)
    assert got["tokens"] == ["He", "llo"] and got["token_logprobs"] == [-0.5, -0.1]
    assert got["top_logprobs"] == [{"He": -0.5}, {"llo": -0.1}]
    assert got["text_offset"] == [0, 2]
    none_asked = completion_logprobs(RESULT, TOKEN_BYTES, 0)["top_logprobs"]
    assert none_asked == [{"He": -0.5}, {"llo": -0.1}]  # the sampled token is always there
    two = completion_logprobs(_Result("llo", [_Entry(2, -2.0, ((1, -0.5), (3, -1.5)))]), TOKEN_BYTES, 2)
    assert two["top_logprobs"] == [{"He": -0.5, " world": -1.5, "llo": -2.0}]


def test_chat_logprobs_shape():
    got = chat_logprobs(RESULT, TOKEN_BYTES, 2)
    assert got["refusal"] is None and [c["token"] for c in got["content"]] == ["He", "llo"]
    first = got["content"][0]
    assert first["logprob"] == -0.5 and first["bytes"] == list(b"He")
    assert first["top_logprobs"] == [{"token": "He", "logprob": -0.5, "bytes": list(b"He")},
                                     {"token": " world", "logprob": -1.5, "bytes": list(b" world")}]
    assert chat_logprobs(RESULT, TOKEN_BYTES, 0)["content"][1]["top_logprobs"] == []
    partial = chat_logprobs(_Result("\ufffd", [_Entry(4, -1.0, ((4, -1.0),))]), TOKEN_BYTES, 1)
    assert partial["content"][0]["bytes"] == [0xE2, 0x82]  # a split character keeps its raw bytes


def test_generate_logprobs_shape():
    got = generate_logprobs(RESULT, TOKEN_BYTES, 1)
    assert got == [{"id": 1, "token": "He", "logprob": -0.5, "top": [{"id": 1, "token": "He", "logprob": -0.5}]},
                   {"id": 2, "token": "llo", "logprob": -0.1, "top": [{"id": 2, "token": "llo", "logprob": -0.1}]}]


def test_a_failed_load_shows_its_error_on_health_without_directories():
    from server.health import health_payload
    from server.state import FAILED, ServingState

    def missing():
        raise FileNotFoundError("[Errno 2] No such file or directory: '/srv/secret/models/m.gguf'")

    state = ServingState(missing, owns_engine=False, drain_timeout=1.0, cancel_backstop=1.0)
    state.start_loading()
    state._load_thread.join(10)
    payload = health_payload(state)
    assert state.status == FAILED and payload["status"] == "failed"
    assert payload["error"] == "FileNotFoundError: [Errno 2] No such file or directory: 'm.gguf'"
    assert "/srv" not in str(payload)


def test_generate_json_schema_alone_implies_format_json():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for body in ({"prompt": "x", "json_schema": schema}, {"prompt": "x", "format": "json", "json_schema": schema}):
        request = parse_generate(body, n_ctx=64)[0].request("r")
        assert request.format == "json" and request.json_schema == schema
    with pytest.raises(BadRequest) as info:
        parse_generate({"prompt": "x", "format": "raw", "json_schema": schema}, n_ctx=64)[0]
    assert info.value.param == "format"
    assert parse_generate({"prompt": "x", "format": "raw"}, n_ctx=64)[0].request("r").format == "raw"


def test_http_api_docs_show_the_sampling_defaults_as_defined():
    from pathlib import Path

    from server.defaults import defaults_table

    readme = (Path(__file__).resolve().parent.parent / "docs" / "http-api.md").read_text(encoding="utf-8")
    section = readme.split("## Sampling defaults", 1)[1].split("\n## ", 1)[0]
    shown = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert shown == defaults_table()


def test_each_entry_point_applies_its_own_defaults():
    from server import defaults

    engine_request = Request("x")
    assert (engine_request.max_tokens, engine_request.sampling.temperature, engine_request.sampling.top_k) == (
        defaults.ENGINE.max_tokens, defaults.ENGINE.temperature, defaults.ENGINE.top_k)
    rendered = RenderedChat([1], ())
    built = [
        (defaults.GENERATE, parse_generate({"prompt": "x"}, n_ctx=4096)[0].request("r")),
        (defaults.COMPLETIONS, parse_completion({"model": "m", "prompt": "x"}, n_ctx=4096).specs[0].request("r")),
        (defaults.CHAT, parse_chat(CHAT, n_ctx=4096).specs[0].request("r", rendered)),
    ]
    for expected, request in built:
        p = request.sampling
        assert (request.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty,
                p.presence_penalty, p.frequency_penalty, p.seed) == (
            expected.max_tokens, expected.temperature, expected.top_p, expected.top_k, expected.min_p,
            expected.repetition_penalty, expected.presence_penalty, expected.frequency_penalty, expected.seed)


def test_the_drain_default_and_shutdown_backstops_are_defined_once():
    import ast
    from pathlib import Path

    from server import context

    assert context.ServerSettings().drain_timeout == context.DEFAULT_DRAIN_TIMEOUT_S
    # The lifespan outwaits the drain's own cancel wait, so the drain ends by itself when healthy.
    assert context.SHUTDOWN_BACKSTOP_S > context.CANCEL_BACKSTOP_S
    assert context.INGRESS_STOP_BACKSTOP_S > context.REPLICA_STOP_BACKSTOP_S
    # The cluster's default is the same name (read from the source: importing deploy imports ray).
    deploy = ast.parse((Path(context.__file__).parent / "cluster" / "deploy.py").read_text(encoding="utf-8"))
    build = next(n for n in deploy.body if isinstance(n, ast.FunctionDef) and n.name == "build_application")
    defaults = dict(zip((a.arg for a in build.args.kwonlyargs), build.args.kw_defaults))
    assert ast.unparse(defaults["drain_timeout"]) == "DEFAULT_DRAIN_TIMEOUT_S"
