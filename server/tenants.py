"""Tenants: who a key belongs to, its share of each tier, its default tier and its limits, read
from a keys file (TOML or JSON, docs/tenants.md).

    [tenants.alice]
    keys = ["sk-alice-1", "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
    weight = 3                      # her share of a tier against others' (default 1)
    default_tier = "interactive"    # a request naming no tier (default: the route's, --default-tier)
    tiers = ["interactive", "batch"]  # tiers she may use (default: both)
    max_in_flight = 8               # limits, each optional
    requests_per_minute = 600
    tokens_per_minute = 200000
    admin = false                   # sees every key's files and batches

A key is given as itself or as `sha256:<hex>` of its UTF-8 bytes, so the file need not hold a
usable key. Keys from --api-key, --api-key-file and COBATCH_API_KEY are one tenant each (named
after a digest of the key, never the key), with weight 1 and no limits. A server without keys has
one anonymous tenant: today's behaviour. Tenant names come only from here (and are checked), so
the per-tenant metrics stay bounded in number.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.tiers import TIERS

ANONYMOUS_TENANT_NAME = "anonymous"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HASHED = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
_FIELDS = {"keys", "weight", "default_tier", "tiers", "max_in_flight", "requests_per_minute",
           "tokens_per_minute", "admin"}


@dataclass(frozen=True)
class Limits:
    """A tenant's limits; None: none of that kind."""

    max_in_flight: int | None = None  # HTTP requests submitted and not yet answered
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt tokens plus the tokens generated (max_tokens until done)

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.max_in_flight, self.requests_per_minute, self.tokens_per_minute))


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = 1.0
    default_tier: str | None = None  # None: the route's default (--default-tier)
    tiers: frozenset[str] = frozenset(TIERS)
    limits: Limits = field(default_factory=Limits)
    admin: bool = False


ANONYMOUS_TENANT = Tenant(ANONYMOUS_TENANT_NAME)


@dataclass(frozen=True)
class TenantKey:
    """One accepted key: its SHA-256 digest and the tenant it belongs to."""

    digest: bytes
    tenant: Tenant


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def tenant_for_plain_key(key: str, admin: bool = False) -> Tenant:
    """The tenant of a key given by --api-key (or its file, or the environment): its own, named
    after a digest of it."""
    return Tenant("key-" + hashlib.sha256(b"cobatch-tenant\0" + key.encode("utf-8")).hexdigest()[:8], admin=admin)


def read_keys_file(path: Path) -> list[TenantKey]:
    """Every key of a TOML (.toml) or JSON file; ValueError naming the first problem."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path.name}: not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {exc}") \
            from None
    return parse_tenants(data, path.name)


def parse_tenants(data: Any, source: str = "keys file") -> list[TenantKey]:
    if not isinstance(data, dict) or set(data) != {"tenants"} or not isinstance(data["tenants"], dict):
        raise ValueError(f"{source}: expected one table 'tenants' of tenant name -> settings")
    keys: list[TenantKey] = []
    seen: dict[bytes, str] = {}
    for name, entry in data["tenants"].items():
        tenant, digests = _tenant(name, entry, f"{source}: tenant {name!r}")
        for digest in digests:
            if digest in seen:
                raise ValueError(f"{source}: a key of tenant {name!r} is also one of {seen[digest]!r}")
            seen[digest] = name
            keys.append(TenantKey(digest, tenant))
    return keys


def _tenant(name: Any, entry: Any, where: str) -> tuple[Tenant, list[bytes]]:
    if not isinstance(name, str) or not _NAME.match(name) or name == ANONYMOUS_TENANT_NAME \
            or name.startswith("key-"):
        raise ValueError(f"{where}: a name is 1-64 letters, digits, '.', '_' or '-' (not 'anonymous', not "
                         "starting 'key-')")
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a table of settings")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_FIELDS))}")
    raw_keys = entry.get("keys")
    if not isinstance(raw_keys, list) or not raw_keys:
        raise ValueError(f"{where}: 'keys' must be a non-empty list of keys (or sha256:<hex> digests)")
    digests = [_digest_of(k, where) for k in raw_keys]
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
        raise ValueError(f"{where}: 'weight' must be a positive number, got {weight!r}")
    tiers = entry.get("tiers", list(TIERS))
    if not isinstance(tiers, list) or not tiers or any(t not in TIERS for t in tiers):
        raise ValueError(f"{where}: 'tiers' must be a non-empty list of {' and '.join(repr(t) for t in TIERS)}")
    default_tier = entry.get("default_tier")
    if default_tier is not None and default_tier not in tiers:
        raise ValueError(f"{where}: 'default_tier' must be one of its tiers {tiers}, got {default_tier!r}")
    limits = Limits(**{f: _positive_int(entry.get(f), f, where)
                       for f in ("max_in_flight", "requests_per_minute", "tokens_per_minute")})
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where}: 'admin' must be true or false")
    return Tenant(name, float(weight), default_tier, frozenset(tiers), limits, admin), digests


def _digest_of(key: Any, where: str) -> bytes:
    if not isinstance(key, str) or not key or any(c.isspace() for c in key):
        raise ValueError(f"{where}: a key must be a non-empty string without whitespace")
    hashed = _HASHED.match(key)
    if hashed:
        return bytes.fromhex(hashed.group(1))
    if key.startswith("sha256:"):
        raise ValueError(f"{where}: a sha256: key is 64 hexadecimal digits (the SHA-256 of the key's UTF-8 bytes)")
    return key_digest(key)


def _positive_int(value: Any, name: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name!r} must be a whole number >= 1, got {value!r}")
    return value
