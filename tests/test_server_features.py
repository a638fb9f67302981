"""Structured output, the extra sampling options and logprobs, through /generate and through
the official `openai` client, against a real server and the real model."""
from __future__ import annotations

import json
import math

import httpx
import jsonschema
import openai
import pydantic
import pytest

from bench.schemas import REVIEW_SCHEMA
from tests.server_fixtures import REVIEW_PROMPT, generate_stream

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
FIRST_TOKEN_PROMPT = "The capital of France is"


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


# ---- structured output -------------------------------------------------------------------------

def test_generate_json_schema_output_validates(http):
    for temperature in (0, 0.8):
        response = http.post("/generate", json={"prompt": REVIEW_PROMPT, "format": "json", "json_schema": REVIEW_SCHEMA,
                                                "max_tokens": 40, "temperature": temperature, "seed": 5})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["finish_reason"] == "stop", body
        document = json.loads(body["text"])
        jsonschema.validate(document, REVIEW_SCHEMA)
        assert body["structured_data"] == document
        assert body["metrics"]["tokens_generated"] <= 40


def test_generate_json_schema_alone_implies_json(http):
    response = http.post("/generate", json={"prompt": REVIEW_PROMPT, "json_schema": REVIEW_SCHEMA,
                                            "max_tokens": 40, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["finish_reason"] == "stop", body
    jsonschema.validate(json.loads(body["text"]), REVIEW_SCHEMA)
    assert body["structured_data"] == json.loads(body["text"])
    # An explicit "raw" contradicts the schema: refused, naming the field to change.
    error = _error(http.post("/generate", json={"prompt": "x", "format": "raw", "json_schema": REVIEW_SCHEMA}), 400)
    assert error["param"] == "format" and "drop \"format\": \"raw\"" in error["message"]


def test_generate_json_without_schema_is_an_object(http):
    body = http.post("/generate", json={"prompt": "A JSON object describing a cat:", "format": "json",
                                        "max_tokens": 30, "temperature": 0}).json()
    assert body["finish_reason"] == "stop", body
    assert isinstance(json.loads(body["text"]), dict) and body["structured_data"] == json.loads(body["text"])


def test_generate_json_stream_ends_with_the_document(live, http):
    events = generate_stream(http, {"prompt": REVIEW_PROMPT, "format": "json", "json_schema": REVIEW_SCHEMA,
                                    "max_tokens": 40, "temperature": 0})
    name, done = events[-1]
    assert name == "done" and "".join(e["text"] for n, e in events if n == "delta") == done["text"]
    jsonschema.validate(done["structured_data"], REVIEW_SCHEMA)


def test_unsupported_schema_keyword_is_400_naming_it(http, live):
    steps = live.engine.stats().steps
    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}}
    error = _error(http.post("/generate", json={"prompt": "x", "format": "json", "json_schema": schema}), 400)
    assert "multipleOf" in error["message"] and error["message"].startswith("json_schema:")
    assert error["param"] == "json_schema"
    error = _error(http.post("/generate", json={"prompt": "x", "format": "json", "json_schema": REVIEW_SCHEMA,
                                                "max_tokens": 3}), 400)
    assert "max_tokens" in error["message"] and error["param"] == "max_tokens"
    assert live.engine.stats().steps == steps  # refused at submit: nothing ran


def test_openai_json_schema_response_format(openai_client):
    completion = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": REVIEW_PROMPT}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "review", "schema": REVIEW_SCHEMA, "strict": True}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), REVIEW_SCHEMA)


class Review(pydantic.BaseModel):
    rating: int = pydantic.Field(ge=1, le=5)
    pros: list[str]
    cons: list[str]
    summary: str


def test_openai_client_parse_with_a_pydantic_model(openai_client):
    completion = openai_client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": REVIEW_PROMPT}], max_tokens=40, temperature=0,
        response_format=Review,
    )
    review = completion.choices[0].message.parsed
    assert isinstance(review, Review) and 1 <= review.rating <= 5


def test_openai_json_object_and_schema_errors(openai_client):
    chat = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a dog as JSON."}], max_tokens=30,
        temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "minimum": 2,
                                                                          "multipleOf": 0.5}}}
    with pytest.raises(openai.BadRequestError, match="multipleOf") as info:
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                       response_format=bad)
    assert info.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="'stop' cannot be combined with JSON output"):
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                       stop=["}"], response_format={"type": "json_object"})


# ---- sampling options --------------------------------------------------------------------------

def _greedy_first_token(http) -> dict:
    body = http.post("/generate", json={"prompt": FIRST_TOKEN_PROMPT, "max_tokens": 1, "temperature": 0,
                                        "logprobs": 0}).json()
    assert len(body["logprobs"]) == 1
    return body["logprobs"][0]


def test_logit_bias_bans_the_greedy_first_token(http, openai_client):
    first = _greedy_first_token(http)
    banned = http.post("/generate", json={"prompt": FIRST_TOKEN_PROMPT, "max_tokens": 1, "temperature": 0,
                                          "logprobs": 0, "logit_bias": {str(first["id"]): -100}}).json()
    assert banned["logprobs"][0]["id"] != first["id"]
    plain = openai_client.completions.create(model=MODEL, prompt=FIRST_TOKEN_PROMPT, max_tokens=1, temperature=0)
    biased = openai_client.completions.create(model=MODEL, prompt=FIRST_TOKEN_PROMPT, max_tokens=1, temperature=0,
                                       logit_bias={str(first["id"]): -100})
    assert plain.choices[0].text == first["token"] and biased.choices[0].text != plain.choices[0].text


def test_logit_bias_errors(http, openai_client):
    error = _error(http.post("/generate", json={"prompt": "x", "logit_bias": {"99999999": 5}}), 400)
    assert "outside the vocabulary" in error["message"] and error["param"] == "logit_bias"
    with pytest.raises(openai.BadRequestError, match="integer token ids"):
        openai_client.completions.create(model=MODEL, prompt="x", max_tokens=1, logit_bias={"hello": 5})


def test_penalties_are_accepted(http, openai_client):
    body = http.post("/generate", json={"prompt": "Repeat: a a a a", "max_tokens": 6, "temperature": 0,
                                        "repetition_penalty": 1.5, "min_p": 0.05, "presence_penalty": 1.0,
                                        "frequency_penalty": 1.0}).json()
    assert body["metrics"]["tokens_generated"] >= 1
    chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=6, presence_penalty=1.5, frequency_penalty=0.5, seed=1,
                                          extra_body={"repetition_penalty": 1.2, "min_p": 0.1})
    assert chat.choices[0].message.content is not None


# ---- logprobs ----------------------------------------------------------------------------------

def test_generate_logprobs_shape(http):
    body = http.post("/generate", json={"prompt": FIRST_TOKEN_PROMPT, "max_tokens": 4, "temperature": 0,
                                        "logprobs": 3}).json()
    entries = body["logprobs"]
    assert 1 <= len(entries) <= 4 and "".join(e["token"] for e in entries) == body["text"]
    for e in entries:
        assert e["logprob"] <= 0 and len(e["top"]) == 3
        assert e["top"][0]["id"] == e["id"]  # greedy picks the likeliest token
        assert [t["logprob"] for t in e["top"]] == sorted((t["logprob"] for t in e["top"]), reverse=True)


def test_completion_logprobs_legacy_shape(openai_client):
    choice = openai_client.completions.create(model=MODEL, prompt=FIRST_TOKEN_PROMPT, max_tokens=4, temperature=0,
                                       logprobs=2).choices[0]
    lp = choice.logprobs
    assert 1 <= len(lp.tokens) <= 4 and "".join(lp.tokens) == choice.text
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(lp.tokens)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and token in top and top[token] == logprob and 1 <= len(top) <= 3
        assert max(top.values()) == logprob
    assert lp.text_offset[0] == 0


def test_chat_logprobs_shape(openai_client):
    chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                          max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert 1 <= len(content) <= chat.usage.completion_tokens
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    for c in content:
        assert c.logprob <= 0 and bytes(c.bytes).decode("utf-8", "replace") == c.token
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token
        assert math.isclose(c.top_logprobs[0].logprob, c.logprob)
    plain = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_logprobs_with_stream_is_400(openai_client):
    with pytest.raises(openai.BadRequestError, match="not supported with"):
        openai_client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logprobs=1, stream=True)


# ---- ignore_eos ---------------------------------------------------------------------------------

def test_ignore_eos_generates_exactly_max_tokens(http, openai_client):
    # A bias that makes end-of-turn (an EOG token) the greedy choice at every step.
    body = {"prompt": "Hello", "max_tokens": 24, "temperature": 0, "logit_bias": {"106": 100}}
    short = http.post("/generate", json=body).json()
    assert short["finish_reason"] == "stop" and short["metrics"]["tokens_generated"] == 1
    full = http.post("/generate", json={**body, "ignore_eos": True})
    assert full.status_code == 200, full.text
    assert full.json()["finish_reason"] == "length" and full.json()["metrics"]["tokens_generated"] == 24
    completion = openai_client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=0,
                                                  logit_bias={"106": 100}, extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 24 and completion.choices[0].finish_reason == "length"


def test_ignore_eos_errors(http):
    error = _error(http.post("/generate", json={"prompt": "x", "ignore_eos": "yes"}), 400)
    assert error["param"] == "ignore_eos"
    error = _error(http.post("/generate", json={"prompt": "x", "format": "json", "ignore_eos": True}), 400)
    assert error["param"] == "ignore_eos" and "JSON output" in error["message"]


# ---- open_objects -------------------------------------------------------------------------------

def test_open_objects_follows_json_schema_on_absent_additional_properties(http):
    # Only 'name' is named; requiring 'age' needs extra members, which the default does not allow.
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
              "required": ["name", "age"]}
    body = {"prompt": "A person as JSON:", "format": "json", "json_schema": schema, "max_tokens": 60,
            "temperature": 0}
    response = http.post("/generate", json={**body, "open_objects": True})
    assert response.status_code == 200, response.text
    document = json.loads(response.json()["text"])
    jsonschema.validate(document, schema)
    assert "age" in document
    error = _error(http.post("/generate", json={"prompt": "x", "open_objects": True}), 400)
    assert error["param"] == "open_objects"
