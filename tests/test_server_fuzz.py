"""Random request bodies on every generation route: each gets an answer or a clear error, never
a server error, and the engine is left idle with no KV held.

Each field takes a valid value, an invalid one for that field, or an odd JSON value; about a
third of the bodies come out valid, so real generations (<= 3 tokens) run between the refusals.
"""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_fixtures import assert_engine_idle, running_server, shared_engine

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
ODD = [None, True, 0, -1, 1.5, 2**70, "", "x", [], [1], {}, {"a": 1}, "\u0000", "é"]
# field -> (valid values, invalid values)
GENERATE = {
    "prompt": (["Hello", "🙂 two", "<start_of_turn>user", ["a", "b"]], ["", 5, ["x", 1], []]),
    "n": ([1, 2], [0, 17]),
    "max_tokens": ([1, 2, 3], [0, -1, "3", 1.5, 10**9]),
    "priority": (["interactive", "batch"], ["other"]),
    "timeout": ([5, 0.5], [0, -1, 86401]),
    "format": (["raw", "json"], ["xml"]),
    "json_schema": ([{"type": "object"}, {"type": "integer"}, {"enum": ["a", "b"]}, {"type": "string", "maxLength": 2}],
                    [{"type": "nonsense"}, {"$ref": "#/nowhere"}, {"not": {}}, {"pattern": "("}, "x"]),
    "temperature": ([0, 0.7, 2], [2.1, -0.1, "hot"]),
    "top_p": ([0.5, 1], [0, 1.1]), "top_k": ([0, 1, 40], [-1, 1.5]), "min_p": ([0, 0.5], [1.1]),
    "repetition_penalty": ([1, 1.3], [0, -1]), "presence_penalty": ([0, -2], [2.1]),
    "logit_bias": ([{}, {"106": -100}, {"1": 100, "106": 100, "212": 100}], [{"-1": 1}, {"262144": 1}, {"x": 1}, {"5": 101}]),
    "logprobs": ([0, 2, 20], [21, -1, "2"]),
    "stop": (["\n", ["a", "b"]], [[""], ["x"] * 20, 5]),
    "seed": ([0, 7], [-1, 2**64, "1"]),
    "stream": ([True, False], ["yes"]),
    "open_objects": ([True, False], [1]),
    "ignore_eos": ([True, False], ["no"]),
}
COMPLETIONS = {
    "model": ([MODEL], ["", 5, "other"]),
    "prompt": (["Hello", ["Hello"], [1, 2, 3], ["a", "b"], [[1, 2]]], ["", [], [[]], ["a", ""], 5]),
    # 0 is valid with echo only (scoring): tests/test_prompt_logprobs_server.py refuses it without
    "max_tokens": ([1, 2], [-1, 10**9]),
    "temperature": ([0, 1], [2.5]), "top_p": ([1, 0.3], [0]),
    "n": ([1, 2], [0, 17]), "best_of": ([1], [2]), "echo": ([False, True], ["yes"]), "suffix": ([None, ""], ["x"]),
    "stream": ([True, False], ["y"]), "stream_options": ([{"include_usage": True}], [{"include_usage": "y"}, []]),
    "stop": (["\n", ["a"]], [[1]]), "seed": ([1], [-5]), "user": (["u"], [5]),
    "logprobs": ([0, 5], [21]), "logit_bias": ([{"1": 2}], [{"a": 1}]), "priority": (["interactive"], ["x"]),
}
CHAT = {
    "model": ([MODEL], [None, "other"]),
    "messages": ([[{"role": "user", "content": "Hi"}],
                  [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]],
                 [[], "hi", [{"role": "user"}], [{"role": "x", "content": "a"}], [{"role": "assistant", "content": "a"}],
                  [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], [1]]),
    "max_tokens": ([1, 2], [0, -3]), "max_completion_tokens": ([1, 2], ["x"]), "temperature": ([0, 1], [-1]),
    "response_format": ([{"type": "json_object"}, {"type": "text"},
                         {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}],
                        [{"type": "json_schema"}, {"type": "bogus"}, "json", {"type": "json_schema", "json_schema": {"schema": "x"}}]),
    "logprobs": ([True, False], [3]), "top_logprobs": ([0, 3], [21, -1]), "stream": ([True, False], [1]),
    "stop": (["x", ["\n"]], [[1]]), "n": ([1, 2], [0, 17]), "tools": ([None], [[{"type": "function"}]]),
}
ROUTES = {"/generate": GENERATE, "/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT}
REQUIRED = {"prompt", "model", "messages"}


@st.composite
def requests(draw):
    path = draw(st.sampled_from(sorted(ROUTES)))
    body = {}
    for field, (valid, invalid) in ROUTES[path].items():
        if field not in REQUIRED and draw(st.integers(0, 9)) < 8:
            continue  # most optional fields absent, so that some bodies are valid
        kind = draw(st.sampled_from(["valid"] * 12 + ["invalid", "odd"]))
        body[field] = draw(st.sampled_from(valid if kind == "valid" else invalid if kind == "invalid" else ODD))
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = 2  # the defaults (16, 512) would make the test long
    return path, body


@pytest.fixture(scope="module")
def live():
    engine = shared_engine()
    with running_server(lambda: engine, engine) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    with httpx.Client(base_url=live.url, timeout=120) as c:
        yield c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=requests())
def test_any_body_gets_an_answer_or_a_clear_error(live, client, request):
    path, body = request
    with client.stream("POST", path, json=body) as r:
        text = r.read().decode()
    assert r.status_code in (200, 400, 404, 501, 504), (path, body, r.status_code, text)
    if r.status_code == 200:
        if body.get("stream") is True:
            assert '"error"' not in text and ("event: done" in text or "data: [DONE]" in text), text
        else:
            assert "error" not in json.loads(text), text
    else:
        message = json.loads(text)["error"]["message"]
        assert isinstance(message, str) and message, text


def test_the_engine_is_idle_after_the_random_bodies(live, client):
    assert_engine_idle(live.engine)
    assert client.get("/health").json()["status"] == "ok"
