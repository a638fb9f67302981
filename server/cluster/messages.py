"""What crosses Ray between the ingress and an engine replica. Every type here pickles.

A replica answers a streamed `generate(EngineCall)` with exactly one `Accepted` or `Rejected`
first, then (when accepted) the text deltas as `str` and finally the engine's GenerationResult.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from engine import EngineClosedError, InvalidParameterError, PromptTooLongError, QueueFullError

# Token ids become characters of Unicode's supplementary private-use planes and above (skipping
# the surrogates), so the router's character radix tree is a token radix tree for rendered chats.
_TOKEN_CHAR_BASE = 0xE000
_MAX_TOKEN_CHAR = 0x10FFFF


def route_key(prompt: str | Sequence[int]) -> str:
    """The text Ray's PrefixCacheAffinityRouter matches on: the prompt itself, or one character
    per token id. Never empty: the router divides by its length."""
    if isinstance(prompt, str):
        return prompt or "\x00"
    chars = []
    for token in prompt:
        code = _TOKEN_CHAR_BASE + token if isinstance(token, int) else -1
        chars.append(chr(code) if _TOKEN_CHAR_BASE <= code <= _MAX_TOKEN_CHAR else "\x00")
    return "".join(chars) or "\x00"


@dataclass(frozen=True)
class EngineCall:
    """One submit(). `prompt` is the routing key Ray's router reads from the first argument;
    `body` is what the engine gets (text, or token ids)."""

    prompt: str
    body: str | tuple[int, ...]
    request_id: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, prompt: str | Sequence[int], request_id: str, options: dict[str, Any]) -> "EngineCall":
        body = prompt if isinstance(prompt, str) else tuple(prompt)
        return cls(route_key(prompt), body, request_id, dict(options))


@dataclass(frozen=True)
class Accepted:
    replica: str  # the replica's Serve id (its unique part)
    prompt_tokens: int


# The engine's refusals, re-raised at the ingress as the same class, so server/generation.py
# maps them to the same HTTP errors as in one process.
REJECTIONS: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (InvalidParameterError, PromptTooLongError, QueueFullError, EngineClosedError)
}


@dataclass(frozen=True)
class Rejected:
    kind: str  # a key of REJECTIONS
    message: str
    field: str | None = None  # InvalidParameterError's field, so the HTTP error names it

    @classmethod
    def of(cls, exc: Exception) -> "Rejected":
        kind = next((name for name, c in REJECTIONS.items() if type(exc) is c), None)
        if kind is None:
            kind = next(name for name, c in REJECTIONS.items() if isinstance(exc, c))
        return cls(kind, str(exc), getattr(exc, "field", None))

    def error(self) -> Exception:
        if self.field is not None:
            return REJECTIONS[self.kind](self.message, field=self.field)
        return REJECTIONS[self.kind](self.message)
