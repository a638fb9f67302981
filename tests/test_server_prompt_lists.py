"""Prompt lists on /v1/completions: one choice per prompt, admitted or refused together, the same
text as each prompt alone, streamed with choice indexes."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from bench.sse import sse_events

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "Two plus two equals", "The colour of the sky is"]


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_each_prompt_is_a_choice_of_its_own(openai_client):
    # (Texts are not compared with each prompt run alone: a row's sums depend on its neighbours
    # in the batch, which is the batch-invariance question, not this feature's.)
    model = _model(openai_client)
    listed = openai_client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert [c.index for c in listed.choices] == [0, 1, 2] and all(c.text for c in listed.choices)
    alone = [openai_client.completions.create(model=model, prompt=p, max_tokens=1) for p in PROMPTS]
    assert listed.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert listed.usage.completion_tokens == 18
    ids = openai_client.completions.create(model=model, prompt=[[2, 818, 5279], [2, 651]], max_tokens=3,
                                           temperature=0)
    assert len(ids.choices) == 2 and all(c.text for c in ids.choices)


def test_a_streamed_list_carries_each_choices_index_and_finish(openai_client):
    model = _model(openai_client)
    texts, finished, usage = {}, {}, None
    for chunk in openai_client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=0,
                                                  stream=True, stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                finished[c.index] = c.finish_reason
    assert set(texts) == set(finished) == {0, 1, 2} and all(texts.values())
    assert set(finished.values()) == {"length"} and usage.completion_tokens == 18


def test_a_list_is_refused_whole_and_nothing_runs(http, live):
    steps = live.engine.stats().steps
    model = http.get("/v1/models").json()["data"][0]["id"]
    too_long = "word " * (live.engine.n_ctx + 10)
    r = http.post("/v1/completions", json={"model": model, "prompt": ["fine", too_long], "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = http.post("/v1/completions", json={"model": model, "prompt": ["x"] * 257, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_prompts"
    assert live.engine.stats().steps == steps  # refused at submit: nothing ran


def test_hanging_up_on_a_streamed_list_cancels_every_choice(live):
    model = httpx.get(f"{live.url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPTS, "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # hang up after the first chunk
    from tests.server_fixtures import wait_until

    wait_until(lambda: live.engine.stats().running == 0, 30, "choices still running after the hang-up")


def test_n_choices_share_one_prompt_and_differ_with_a_seed(openai_client, live):
    model = _model(openai_client)
    prompt = "Write one sentence about the sea, then one about mountains. " * 12
    before = live.engine.stats().tokens_prefilled
    first = openai_client.completions.create(model=model, prompt=prompt, n=4, max_tokens=12, temperature=0.9,
                                             seed=11)
    prefilled = live.engine.stats().tokens_prefilled - before
    prompt_tokens = first.usage.prompt_tokens
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert len({c.text for c in first.choices}) > 1  # derived seeds: the choices differ
    # Counted once in usage, and computed about once: each later choice recomputes at most the
    # prompt's last partial block (the prefix cache shares whole blocks).
    assert prompt_tokens == len(live.engine.model.tokenize(prompt, add_bos=True))
    assert prefilled <= prompt_tokens + 3 * 17
    # (The seeds themselves are reproducible: tests/test_server_units.py. Equal texts across runs
    # would also need every step's sums not to depend on the cache's layout and the neighbours.)
    chat = openai_client.chat.completions.create(model=model, n=2, max_tokens=6, seed=3,
                                                 messages=[{"role": "user", "content": "Name an animal."}])
    assert [c.index for c in chat.choices] == [0, 1] and all(c.finish_reason for c in chat.choices)


def test_generate_takes_prompt_lists_and_n(http):
    r = http.post("/generate", json={"prompt": PROMPTS[:2], "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1] and all(c["text"] for c in choices)
    assert all(c["finish_reason"] == "length" and c["metrics"]["tokens_generated"] == 5 for c in choices)
    n = http.post("/generate", json={"prompt": PROMPTS[0], "n": 3, "max_tokens": 5, "temperature": 0.9,
                                     "seed": 4}).json()["choices"]
    assert [c["index"] for c in n] == [0, 1, 2]
    with http.stream("POST", "/generate", json={"prompt": PROMPTS[:2], "max_tokens": 5, "temperature": 0,
                                                "stream": True}) as response:
        events = [(name, json.loads(data)) for name, data in sse_events(response.iter_lines())]
    texts = {0: "", 1: ""}
    for name, data in events:
        if name == "delta":
            texts[data["index"]] += data["text"]
    assert sorted(d["index"] for name, d in events if name == "choice") == [0, 1]
    assert events[-1][0] == "done" and [c["text"] for c in events[-1][1]["choices"]] == [texts[0], texts[1]]
