"""Per-token log-probabilities in the shapes the APIs return.

The engine gives one TokenLogprob(token, logprob, top) per generated token, `top` holding the
most likely tokens best first (at least one: the engine records logprobs only when asked for
one alternative or more, so `n` here is how many of them the client asked to see).

Only tokens that contribute to the returned text are reported: an end-of-generation token, and
the tokens of a stop string the text was cut at, are left out (a token is kept when it starts
before the end of the text, measured in bytes).
"""
from __future__ import annotations

from typing import Any, Sequence

from engine import GenerationResult


def visible(result: GenerationResult, token_bytes: Sequence[bytes]) -> list[Any]:
    entries = list(result.logprobs or ())
    limit = len(result.text.encode("utf-8"))
    kept, offset = [], 0
    for entry in entries:
        if offset >= limit:
            break
        kept.append(entry)
        offset += len(token_bytes[entry.token])
    return kept


def token_text(token_bytes: Sequence[bytes], token: int) -> str:
    return token_bytes[token].decode("utf-8", "replace")


def completion_logprobs(result: GenerationResult, token_bytes: Sequence[bytes], n: int) -> dict[str, Any]:
    """OpenAI's legacy completions format. As OpenAI documents it, each top_logprobs dict holds
    the n most likely tokens and the sampled one (so up to n + 1 entries); tokens whose text is
    the same share a key (the likelier one is kept)."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    offset = 0
    for entry in visible(result, token_bytes):
        text = token_text(token_bytes, entry.token)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        top: dict[str, float] = {}
        for token, logprob in entry.top[:n]:
            top.setdefault(token_text(token_bytes, token), logprob)
        top.setdefault(text, entry.logprob)
        top_logprobs.append(top)
        text_offset.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}


def _chat_token(token_bytes: Sequence[bytes], token: int, logprob: float) -> dict[str, Any]:
    raw = token_bytes[token]
    return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(result: GenerationResult, token_bytes: Sequence[bytes], n: int) -> dict[str, Any]:
    """OpenAI's chat format: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": None}."""
    content = []
    for entry in visible(result, token_bytes):
        item = _chat_token(token_bytes, entry.token, entry.logprob)
        item["top_logprobs"] = [_chat_token(token_bytes, t, lp) for t, lp in entry.top[:n]]
        content.append(item)
    return {"content": content, "refusal": None}


def generate_logprobs(result: GenerationResult, token_bytes: Sequence[bytes], n: int) -> list[dict[str, Any]]:
    """/generate's format: [{"id", "token", "logprob", "top": [{"id", "token", "logprob"}]}]."""
    def one(token: int, logprob: float) -> dict[str, Any]:
        return {"id": token, "token": token_text(token_bytes, token), "logprob": logprob}

    out = []
    for entry in visible(result, token_bytes):
        item = one(entry.token, entry.logprob)
        item["top"] = [one(t, lp) for t, lp in entry.top[:n]]
        out.append(item)
    return out
