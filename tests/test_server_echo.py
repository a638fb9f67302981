"""echo and prompt logprobs on /v1/completions (what lm-evaluation-harness sends), the tokenizer
endpoints its remote tokenizer reads, and the refusals around them."""
from __future__ import annotations

import json

import pytest

from bench.sse import sse_events

pytestmark = pytest.mark.model

PROMPT = "The quick brown fox jumps over the lazy"


def complete(http, **body):
    model = http.get("/v1/models").json()["data"][0]["id"]
    return http.post("/v1/completions", json={"model": model, "prompt": PROMPT, **body})


def test_echo_scores_the_prompt_then_the_completion(http, live):
    reply = complete(http, echo=True, logprobs=2, max_tokens=3, temperature=0)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    plain = complete(http, max_tokens=3, temperature=0).json()["choices"][0]
    assert choice["text"] == PROMPT + plain["text"]
    lp = choice["logprobs"]
    ids = live.engine.model.tokenize(PROMPT)
    n = len(ids) + 3
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x < 0 for x in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == choice["text"]  # the BOS token's text is empty
    assert lp["text_offset"][len(ids)] == len(PROMPT)  # the completion's offsets follow the prompt
    assert lp["text_offset"] == sorted(lp["text_offset"])
    for token, logprob, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert top[token] == logprob and 2 <= len(top) <= 3 and max(top.values()) >= logprob
    # The completion's part is the same as without echo.
    alone = complete(http, logprobs=2, max_tokens=3, temperature=0).json()["choices"][0]["logprobs"]
    assert lp["tokens"][len(ids):] == alone["tokens"]


def test_max_tokens_zero_scores_without_generating(http):
    reply = complete(http, echo=True, logprobs=0, max_tokens=0, prompt=[[2, 818, 3823], [2, 818]])
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == 5
    first, second = (c["logprobs"]["token_logprobs"] for c in body["choices"])
    assert len(first) == 3 and first[0] is None and second == first[:2]  # same prefix, same scores
    assert body["choices"][0]["text"] == http.post("/detokenize", json={"tokens": [2, 818, 3823]}).json()["content"]


def test_openai_client_echo(openai_client):
    model = openai_client.models.list().data[0].id
    out = openai_client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0)
    assert out.choices[0].text == PROMPT and out.choices[0].logprobs.token_logprobs[0] is None
    assert out.usage.completion_tokens == 0


def test_echo_streamed_sends_the_prompt_first(http):
    model = http.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "echo": True, "max_tokens": 2, "stream": True, "temperature": 0}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = [data for _, data in sse_events(response.iter_lines())]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert chunks[0]["choices"][0]["text"] == PROMPT
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    plain = complete(http, max_tokens=2, temperature=0).json()["choices"][0]["text"]
    assert streamed == PROMPT + plain


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 1, "stream": True}, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "echo": "yes"}, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),
])
def test_refusals_name_the_field(http, path, body, param):
    model = http.get("/v1/models").json()["data"][0]["id"]
    reply = http.post(path, json={"model": model, **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert http.get("/health").status_code == 200


def test_tokenizer_endpoints_in_vllms_spelling(http, live):
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] == "<eos>" and info["bos_token"] == "<bos>"
    assert info["model_max_length"] == live.engine.n_ctx
    # What lm-eval's remote tokenizer sends: special tokens in the text are read as such.
    eos = http.post("/tokenize", json={"prompt": "<eos>", "add_special_tokens": False}).json()["tokens"]
    assert eos == [live.engine.model.eos_token]
    ids = http.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()["tokens"]
    assert ids == live.engine.model.tokenize(PROMPT, add_bos=False)
    assert http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"] == [2] + ids  # vLLM's default adds BOS
    assert http.post("/detokenize", json={"tokens": ids}).json()["prompt"] == PROMPT
    both = http.post("/tokenize", json={"prompt": PROMPT, "content": PROMPT})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
