"""Prompt lists on /v1/completions: one choice per prompt, admitted or refused together, the same
text as each prompt alone, streamed with choice indexes."""
from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "Two plus two equals", "The colour of the sky is"]


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_each_prompt_is_a_choice_with_the_text_it_gets_alone(openai_client):
    model = _model(openai_client)
    listed = openai_client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=0)
    assert [c.index for c in listed.choices] == [0, 1, 2]
    alone = [openai_client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0) for p in PROMPTS]
    assert [c.text for c in listed.choices] == [a.choices[0].text for a in alone]
    assert listed.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert listed.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    ids = openai_client.completions.create(model=model, prompt=[[2, 818, 5279], [2, 651]], max_tokens=3,
                                           temperature=0)
    assert len(ids.choices) == 2 and all(c.text for c in ids.choices)


def test_a_streamed_list_carries_each_choices_index_and_finish(openai_client):
    model = _model(openai_client)
    plain = openai_client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=0)
    texts, finished, usage = {}, {}, None
    for chunk in openai_client.completions.create(model=model, prompt=PROMPTS, max_tokens=6, temperature=0,
                                                  stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                finished[c.index] = c.finish_reason
    assert texts == {i: c.text for i, c in enumerate(plain.choices)}
    assert set(finished) == {0, 1, 2} and usage.total_tokens == plain.usage.total_tokens


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
