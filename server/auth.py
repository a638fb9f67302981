"""API keys: with any configured, every route but the open ones needs `Authorization: Bearer KEY`
or `x-api-key: KEY`.

The first is what the openai SDK sends, the second what the anthropic SDK sends; either is
accepted on every route. Keys are kept only as SHA-256 digests and a presented key is compared
with every one of them in constant time, so neither the answer's timing nor a memory dump gives
a key away; no key, right or wrong, is ever logged. A refusal is a 401 in the route's error
shape (OpenAI's, or Anthropic's on the Messages routes: server/error_shapes.py), which each SDK
raises as its AuthenticationError.

A request that passes carries its Caller: the owner id of its key (what files and batches are
filed under; `owner_for_key`, a digest, never the key, or the tenant's name for a key from a keys
file), whether it may see every owner's (an admin key, or the server's own job requests), and
its tenant (server/tenants.py: weight, default tier, limits). Without keys every request is the
anonymous owner and tenant. The server's own requests for a batch job name the job's owner in
`x-cobatch-batch-owner`, honoured only under the server's internal key, so a job's lines count
for the tenant that created it.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

from server.error_shapes import error_response
from server.errors import APIError
from server.jobs.in_process import BATCH_OWNER_HEADER
from server.jobs.store import ANONYMOUS
from server.tenants import ANONYMOUS_TENANT, Tenant, TenantKey, key_digest, tenant_for_plain_key

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


@dataclass(frozen=True)
class Caller:
    owner: str  # files and batches are filed under this
    sees_all: bool = False  # an admin key or the server itself: every owner's files and batches
    tenant: Tenant = ANONYMOUS_TENANT
    internal: bool = False  # the server's own key (batch jobs through its routes)

    @property
    def scope(self) -> str | None:
        """The owner whose rows a lookup may see; None: all of them."""
        return None if self.sees_all else self.owner


ANONYMOUS_CALLER = Caller(ANONYMOUS)


def owner_for_key(key: str) -> str:
    """The owner id of a key given by itself (--api-key): stable across restarts, and no way back
    to the key. A keys file's tenants own theirs by name (`owner_for_tenant`)."""
    return "key-" + hashlib.sha256(b"cobatch-owner\0" + key.encode("utf-8")).hexdigest()[:32]


def owner_for_tenant(tenant: Tenant) -> str:
    """Every key of a keys-file tenant files under one owner: rotating a key keeps its batches."""
    return f"tenant-{tenant.name}"


def caller_of(request: Any) -> Caller:
    """Who sent `request` (a Starlette request): set by RequireKeys, anonymous without keys."""
    return request.scope.get("state", {}).get("caller", ANONYMOUS_CALLER)


class KeyCheck:
    def __init__(self, keys: Iterable[str], admin_keys: Iterable[str] = (),
                 tenant_keys: Iterable[TenantKey] = ()) -> None:
        # (digest, its caller); the server's own calls (batch jobs through its routes) carry internal_key.
        self.internal_key = secrets.token_urlsafe(32)
        self._callers: list[tuple[bytes, Caller]] = [
            (key_digest(k), Caller(owner_for_key(k), admin, tenant_for_plain_key(k, admin)))
            for keys_, admin in ((keys, False), (admin_keys, True)) for k in keys_]
        self._callers += [(t.digest, Caller(owner_for_tenant(t.tenant), t.tenant.admin, t.tenant))
                          for t in tenant_keys]
        self._by_owner = {caller.owner: caller for _, caller in self._callers}
        self._callers.append((key_digest(self.internal_key),
                              Caller(owner_for_key(self.internal_key), True, internal=True)))

    @property
    def tenants(self) -> list[Tenant]:
        """Every configured tenant, once each (the server's own key has none of its own)."""
        return list({c.tenant.name: c.tenant for _, c in self._callers if not c.internal}.values())

    def on_behalf_of(self, caller: Caller, owner: str | None) -> Caller:
        """The caller a request counts for: a batch job's owner when the server itself sends it
        (its tenant, if the key that made it is still configured), else `caller`."""
        if not caller.internal or not owner:
            return caller
        found = self._by_owner.get(owner)
        return Caller(owner, sees_all=True, tenant=found.tenant if found else ANONYMOUS_TENANT, internal=True)

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller a bearer key names, or None if it names no configured key."""
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.identify_key(presented)

    def identify_key(self, presented: str | None) -> Caller | None:
        """The caller a bare key (an x-api-key header's) names, or None."""
        presented = (presented or "").strip()
        if not presented:
            return None
        candidate = key_digest(presented)
        matched: Caller | None = None
        for digest, caller in self._callers:  # no early exit: the time taken says nothing of which matched
            if hmac.compare_digest(candidate, digest):
                matched = caller
        return matched


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
        api_key = headers.get(b"x-api-key", b"").decode("latin-1")
        caller = self.check.identify(authorization) or self.check.identify_key(api_key)
        if caller is not None:
            owner = headers.get(BATCH_OWNER_HEADER.encode(), b"").decode("latin-1")
            caller = self.check.on_behalf_of(caller, owner)
            scope.setdefault("state", {})["caller"] = caller
            return await self.app(scope, receive, send)
        message = ("this server needs an API key: send Authorization: Bearer <key> or x-api-key: <key>"
                   if not (authorization or api_key) else "the API key is not valid")
        error = Unauthorized(message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        await error_response(error, scope)(scope, receive, send)
