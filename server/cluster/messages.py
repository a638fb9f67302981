"""What crosses Ray between the ingress and an engine replica. Every type here pickles.

A replica answers a streamed `generate(EngineCall)` with exactly one `Accepted` or `Rejected`
first, then (when accepted) the text deltas as `str` and finally the engine's GenerationResult.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine import REFUSALS, Request, RequestError

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
    `request` is what the replica's engine runs (validated at the ingress; it pickles)."""

    prompt: str
    request: Request

    @classmethod
    def of(cls, request: Request) -> "EngineCall":
        return cls(route_key(request.prompt), request)


@dataclass(frozen=True)
class Accepted:
    replica: str  # the replica's Serve id (its unique part)
    prompt_tokens: int


@dataclass(frozen=True)
class Rejected:
    """The engine's refusal, re-raised at the ingress as the same class, so server/generation.py
    maps it to the same HTTP error as in one process."""

    kind: str  # a key of REFUSALS
    message: str
    field: str | None = None  # InvalidParameterError's field, so the HTTP error names it

    @classmethod
    def of(cls, exc: RequestError) -> "Rejected":
        kind = next((name for name, c in REFUSALS.items() if type(exc) is c), None)
        if kind is None:  # a subclass: sent as the listed class it derives from
            kind = next(name for name, c in REFUSALS.items() if isinstance(exc, c))
        return cls(kind, str(exc), getattr(exc, "field", None))

    def error(self) -> RequestError:
        if self.field is not None:
            return REFUSALS[self.kind](self.message, field=self.field)  # type: ignore[call-arg]
        return REFUSALS[self.kind](self.message)
