"""API keys: with any configured, every route but the open ones needs `Authorization: Bearer KEY`.

Keys are kept only as SHA-256 digests and a presented key is compared with every one of them in
constant time, so neither the answer's timing nor a memory dump gives a key away; no key, right
or wrong, is ever logged. A refusal is a 401 in OpenAI's error shape, which its clients raise as
AuthenticationError.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

from server.errors import APIError

ENV_VAR = "COBATCH_API_KEY"  # one key, or several separated by commas
OPEN_PATHS = frozenset({"/health"})  # and /metrics unless it is protected too

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


class Unauthorized(APIError):
    status_code = 401
    error_type = "invalid_request_error"


def read_keys(keys: Iterable[str] = (), key_file: Path | None = None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Keys from the command line, a file (one per line, # comments) and the environment."""
    found = [k.strip() for k in keys]
    if key_file is not None:
        for line in key_file.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                found.append(line)
    env = (os.environ if environ is None else environ).get(ENV_VAR, "")
    found += [k.strip() for k in env.split(",") if k.strip()]
    if any(not k or any(c.isspace() for c in k) for k in found):
        raise ValueError("an API key must be non-empty and hold no whitespace")
    return tuple(dict.fromkeys(found))


class KeyCheck:
    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(k) for k in keys]
        # The server's own calls (batch jobs through its routes) carry this one.
        self.internal_key = secrets.token_urlsafe(32)
        self._digests.append(_digest(self.internal_key))

    def allows(self, authorization: str | None) -> bool:
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return False
        candidate = _digest(presented.strip())
        matched = False
        for digest in self._digests:  # no early exit: the time taken says nothing of which matched
            matched |= hmac.compare_digest(candidate, digest)
        return matched


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class RequireKeys:
    """ASGI middleware: a key check on every HTTP request to a path not in `open_paths`."""

    def __init__(self, app: ASGIApp, check: KeyCheck, open_paths: frozenset[str]) -> None:
        self.app = app
        self.check = check
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if self.check.allows(authorization):
            return await self.app(scope, receive, send)
        message = ("this server needs an API key: send Authorization: Bearer <key>" if not authorization
                   else "the API key is not valid")
        error = Unauthorized(message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        await error.response()(scope, receive, send)
