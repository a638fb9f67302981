"""The OpenAI-compatible API, driven by the official `openai` client, unchanged."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from bench.sse import sse_events
from server.chat_format import ChatMessage
from tests.server_fixtures import assert_engine_idle, wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"


def test_models_lists_the_served_model(openai_client):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert openai_client.models.retrieve(MODEL).id == MODEL


def test_completion(openai_client, live):
    prompt = "The three primary colours are"
    completion = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    choice = completion.choices[0]
    assert completion.object == "text_completion" and completion.model == MODEL
    assert isinstance(choice.text, str) and choice.text and choice.finish_reason in ("stop", "length")
    assert completion.usage.prompt_tokens == len(live.engine.tokenize(prompt))
    assert 1 <= completion.usage.completion_tokens <= 8
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_completion_stream_matches_the_non_streamed_text(openai_client):
    args = dict(model=MODEL, prompt="A haiku about rain:", max_tokens=10, temperature=0)
    full = openai_client.completions.create(**args).choices[0].text
    chunks = list(openai_client.completions.create(stream=True, **args))
    assert "".join(c.choices[0].text for c in chunks) == full
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_completion(openai_client, live):
    messages = [{"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "What colour is the sky?"}]
    chat = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    message = chat.choices[0].message
    assert chat.object == "chat.completion" and message.role == "assistant"
    assert isinstance(message.content, str) and message.content.strip()
    # The prompt was rendered in Gemma 3's turn format, with the turn markers as single tokens.
    rendered = live.ctx.state.chat.render([ChatMessage(m["role"], m["content"]) for m in messages])
    assert chat.usage.prompt_tokens == len(rendered.token_ids)
    start_of_turn = live.engine.model.tokenize("<start_of_turn>", add_bos=False, parse_special=True)
    assert len(start_of_turn) == 1 and rendered.token_ids.count(start_of_turn[0]) == 2


def test_chat_stream_with_usage(openai_client):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
    full = openai_client.chat.completions.create(**args).choices[0].message.content
    chunks = list(openai_client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_stream_ends_with_done_marker(live):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    with httpx.Client(base_url=live.url, timeout=60) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        data = [d for _, d in sse_events(r.iter_lines())]
    assert data[-1] == "[DONE]" and all(d.startswith("{") for d in data[:-1])


def test_extensions_priority_and_top_k(openai_client):
    chat = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        extra_body={"priority": "interactive", "top_k": 5}, seed=3,
    )
    assert chat.choices[0].message.content is not None


def test_return_token_ids_gives_the_generated_ids(openai_client, live):
    args = dict(model=MODEL, max_tokens=8, temperature=0, extra_body={"return_token_ids": True})
    completion = openai_client.completions.create(prompt="The capital of France is", **args)
    chat = openai_client.chat.completions.create(messages=[{"role": "user", "content": "Say hello."}], **args)
    token_bytes = live.engine.model.token_bytes
    for choice, usage in ((completion.choices[0], completion.usage), (chat.choices[0], chat.usage)):
        ids = choice.model_extra["token_ids"]
        assert len(ids) == usage.completion_tokens and all(isinstance(t, int) for t in ids)
        text = choice.text if hasattr(choice, "text") else choice.message.content
        if choice.finish_reason == "length":  # an end-of-generation token is not text
            assert b"".join(token_bytes[t] for t in ids).decode() == text
    plain = openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert "token_ids" not in (plain.choices[0].model_extra or {})
    with pytest.raises(openai.BadRequestError, match="'return_token_ids' is served on answers that are not streamed"):
        openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, stream=True,
                                         extra_body={"return_token_ids": True})


def test_json_response_formats_give_json(openai_client):
    for response_format in ({"type": "json_object"},
                            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}):
        chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=24, temperature=0, response_format=response_format)
        assert isinstance(json.loads(chat.choices[0].message.content), dict)


def test_errors_reach_the_client_with_their_messages(openai_client):
    with pytest.raises(openai.NotFoundError, match="not served here"):
        openai_client.completions.create(model="gpt-4", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="'temperature' must be <= 2.0"):
        openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=3)
    with pytest.raises(openai.BadRequestError, match="'messages' must be a non-empty list"):
        openai_client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="'n' must be <= 16"):
        openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, n=17)
    with pytest.raises(openai.BadRequestError, match="unknown field"):
        openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"bogus": 1})


def test_stream_disconnect_through_the_openai_client_frees_the_request(openai_client, live):
    stream = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long essay about rivers."}],
        max_tokens=1000, stream=True)
    # The role chunk opens the stream before the engine admits the request: read up to generated text.
    next(c for c in stream if c.choices and c.choices[0].delta.content)
    assert wait_until(lambda: live.engine.stats().running == 1, 30, "the request never ran")
    stream.close()
    assert_engine_idle(live.engine)
