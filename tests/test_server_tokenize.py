"""/tokenize and /detokenize in llama-server's shapes, and a chat's count equal to what the chat
route reports as prompt_tokens."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.model


def test_tokenize_and_detokenize_round_trip(http, live):
    text = "Héllo wörld, 3 × 4 = 12 🙂"
    plain = http.post("/tokenize", json={"content": text}).json()
    assert plain["tokens"] == live.engine.model.tokenize(text, add_bos=False)
    assert plain["count"] == len(plain["tokens"]) and plain["max_model_len"] == live.engine.n_ctx
    special = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    assert special[0] == 2 and special[1:] == plain["tokens"]  # BOS first
    assert http.post("/detokenize", json={"tokens": plain["tokens"]}).json() == {"content": text, "prompt": text}
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain["tokens"]
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == text


def test_a_chats_count_is_the_chat_routes_prompt_tokens(http, openai_client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    counted = http.post("/tokenize", json={"messages": messages}).json()["count"]
    model = openai_client.models.list().data[0].id
    reply = openai_client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert counted == reply.usage.prompt_tokens > 0


@pytest.mark.parametrize("path, body", [
    ("/tokenize", {}),
    ("/tokenize", {"content": "a", "messages": [{"role": "user", "content": "b"}]}),
    ("/tokenize", {"content": 5}),
    ("/tokenize", {"content": "a", "bogus": 1}),
    ("/tokenize", {"messages": []}),
    ("/detokenize", {"tokens": "abc"}),
    ("/detokenize", {"tokens": [1, -1]}),
    ("/detokenize", {"tokens": [10**9]}),
    ("/detokenize", {"tokens": [True]}),
])
def test_bad_bodies_are_400s(http, path, body):
    r = http.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["message"]
