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
        top_logprobs.append(_top_dict(token_bytes, entry, n, text))
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


def echo_text(prompt: str | Sequence[int], token_bytes: Sequence[bytes]) -> str:
    """The prompt as echo returns it: the text as sent, or token ids decoded."""
    if isinstance(prompt, str):
        return prompt
    return b"".join(token_bytes[t] for t in prompt).decode("utf-8", "replace")


def echoed_completion_logprobs(result: GenerationResult, token_bytes: Sequence[bytes], n: int,
                               prompt_text: str) -> dict[str, Any]:
    """The legacy format over the prompt then the completion (echo with logprobs, as vLLM and
    OpenAI's legacy API give it): the first prompt token's logprob and top_logprobs are null, and
    the completion's text offsets count from the end of the echoed prompt."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    offset = 0
    for token, entry in zip(result.prompt_token_ids or (), result.prompt_logprobs or ()):
        text = token_text(token_bytes, token)
        tokens.append(text)
        token_logprobs.append(None if entry is None else entry.logprob)
        top_logprobs.append(None if entry is None else _top_dict(token_bytes, entry, n, text))
        text_offset.append(offset)
        offset += len(text)
    generated = completion_logprobs(result, token_bytes, n)
    return {"tokens": tokens + generated["tokens"],
            "token_logprobs": token_logprobs + generated["token_logprobs"],
            "top_logprobs": top_logprobs + generated["top_logprobs"],
            "text_offset": text_offset + [len(prompt_text) + o for o in generated["text_offset"]]}


def _top_dict(token_bytes: Sequence[bytes], entry: Any, n: int, text: str) -> dict[str, float]:
    top: dict[str, float] = {}
    for token, logprob in entry.top[:n]:
        top.setdefault(token_text(token_bytes, token), logprob)
    top.setdefault(text, entry.logprob)
    return top
