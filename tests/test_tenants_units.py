"""Tenants without a server: the keys file (server/tenants.py), keys → callers (server/auth.py)
and the limits' arithmetic and headers (server/quotas.py) under a clock the test moves."""
from __future__ import annotations

import hashlib
import json

import pytest

from server.auth import KeyCheck, owner_for_key
from server.quotas import Quotas, RateLimited, duration
from server.tenants import Limits, Tenant, parse_tenants, read_keys_file, tenant_for_plain_key

HASHED = "sha256:" + hashlib.sha256(b"sk-hashed").hexdigest()
TOML = f"""
[tenants.alice]
keys = ["sk-alice", "{HASHED}"]
weight = 3
default_tier = "interactive"
max_in_flight = 4
requests_per_minute = 100
tokens_per_minute = 5000

[tenants.bob]
keys = ["sk-bob"]
tiers = ["batch"]
admin = true
"""


def test_a_toml_or_json_keys_file_gives_each_key_its_tenant(tmp_path):
    toml_file = tmp_path / "keys.toml"
    toml_file.write_text(TOML)
    keys = read_keys_file(toml_file)
    json_file = tmp_path / "keys.json"
    json_file.write_text(json.dumps({"tenants": {
        "alice": {"keys": ["sk-alice", HASHED], "weight": 3, "default_tier": "interactive", "max_in_flight": 4,
                  "requests_per_minute": 100, "tokens_per_minute": 5000},
        "bob": {"keys": ["sk-bob"], "tiers": ["batch"], "admin": True}}}))
    assert read_keys_file(json_file) == keys
    alice, bob = keys[0].tenant, keys[2].tenant
    assert keys[1].tenant is alice and keys[1].digest == hashlib.sha256(b"sk-hashed").digest()
    assert alice == Tenant("alice", 3.0, "interactive", frozenset({"interactive", "batch"}),
                           Limits(4, 100, 5000), admin=False)
    assert bob.tiers == frozenset({"batch"}) and bob.admin and bob.default_tier is None and not bob.limits.any


@pytest.mark.parametrize("tenants, problem", [
    ({"a": {"keys": []}}, "'keys'"),
    ({"a": {"keys": ["sk a"]}}, "whitespace"),
    ({"a": {"keys": ["sha256:abc"]}}, "64 hexadecimal"),
    ({"a": {"keys": ["k"], "weight": 0}}, "'weight'"),
    ({"a": {"keys": ["k"], "weight": True}}, "'weight'"),
    ({"a": {"keys": ["k"], "tiers": ["gold"]}}, "'tiers'"),
    ({"a": {"keys": ["k"], "tiers": ["batch"], "default_tier": "interactive"}}, "'default_tier'"),
    ({"a": {"keys": ["k"], "max_in_flight": 0}}, "'max_in_flight'"),
    ({"a": {"keys": ["k"], "tokens_per_minute": 1.5}}, "'tokens_per_minute'"),
    ({"a": {"keys": ["k"], "quota": 3}}, "unknown field"),
    ({"anonymous": {"keys": ["k"]}}, "a name is"),
    ({"bad name": {"keys": ["k"]}}, "a name is"),
    ({"key-x": {"keys": ["k"]}}, "a name is"),
    ({"a": {"keys": ["k"]}, "b": {"keys": ["k"]}}, "also one of"),
])
def test_a_bad_keys_file_is_refused_naming_the_problem(tenants, problem):
    with pytest.raises(ValueError, match=problem):
        parse_tenants({"tenants": tenants})


def test_keys_name_their_tenant_and_the_servers_own_key_may_speak_for_a_batch_owner(tmp_path):
    (tmp_path / "k.toml").write_text(TOML)
    check = KeyCheck(["sk-plain"], ["sk-admin"], read_keys_file(tmp_path / "k.toml"))
    alice = check.identify("Bearer sk-hashed")
    assert alice.tenant.name == "alice" and alice.owner == "tenant-alice" and not alice.sees_all
    assert check.identify_key("sk-alice") == alice
    assert check.identify_key("sk-bob").sees_all and check.identify_key("sk-bob").tenant.name == "bob"
    plain = check.identify("Bearer sk-plain")
    assert plain.owner == owner_for_key("sk-plain") and plain.tenant == tenant_for_plain_key("sk-plain")
    assert "sk-plain" not in plain.tenant.name and plain.tenant.weight == 1 and not plain.tenant.limits.any
    assert {t.name for t in check.tenants} == {"alice", "bob", plain.tenant.name, tenant_for_plain_key("sk-admin").name}
    server = check.identify(f"Bearer {check.internal_key}")
    assert server.internal and check.on_behalf_of(server, "tenant-alice").tenant.name == "alice"
    assert check.on_behalf_of(server, "tenant-alice").internal  # still the server's: the runner paces it
    assert check.on_behalf_of(server, "tenant-gone").tenant.name == "anonymous"
    assert check.on_behalf_of(alice, "tenant-bob") is alice  # a client cannot speak for another
    assert check.identify("Bearer sha256:" + hashlib.sha256(b"sk-hashed").hexdigest()) is None  # not a key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limited(**limits) -> Tenant:
    return Tenant("t", limits=Limits(**limits))


def test_the_request_past_the_in_flight_limit_is_refused_until_one_finishes():
    quotas, tenant = Quotas(Clock()), limited(max_in_flight=2)
    first, _ = quotas.admit(tenant, lambda: 5, 10), quotas.admit(tenant, lambda: 5, 10)
    with pytest.raises(RateLimited) as refused:
        quotas.admit(tenant, lambda: 5, 10)
    assert refused.value.reason == "in_flight" and refused.value.status_code == 429
    assert refused.value.headers == {"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0",
                                     "x-ratelimit-reset-requests": "1s", "Retry-After": "1",
                                     "retry-after-ms": "1000"}
    assert quotas.in_flight() == {"t": 2}
    first.finish(3)
    quotas.admit(tenant, lambda: 5, 10)


def test_tokens_per_minute_refuse_exactly_past_the_limit_and_settle_to_what_was_computed():
    clock = Clock()
    quotas, tenant = Quotas(clock), limited(tokens_per_minute=100)
    held = [quotas.admit(tenant, lambda: 10, 10) for _ in range(5)]  # 5 x (10 prompt + 10 max_tokens) = 100
    clock.now += 10
    with pytest.raises(RateLimited) as refused:
        quotas.admit(tenant, lambda: 1, 0)
    headers = refused.value.headers
    assert refused.value.reason == "tokens_per_minute"
    assert headers["x-ratelimit-limit-tokens"] == "100" and headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-reset-tokens"] == "50s" and headers["Retry-After"] == "50"
    assert "x-ratelimit-limit-requests" not in headers  # no request limit: no request set
    held[0].finish(2)  # generated 2 of its 10: charged 12, so 8 come back
    ok = quotas.admit(tenant, lambda: 4, 4)
    with pytest.raises(RateLimited):
        quotas.admit(tenant, lambda: 1, 0)
    ok.refund()  # refused downstream (a full queue): it keeps nothing
    quotas.admit(tenant, lambda: 4, 4)
    clock.now += 50.001  # the first five leave the window
    quotas.admit(tenant, lambda: 50, 42)


def test_requests_per_minute_slide_and_a_request_larger_than_the_limit_says_so():
    clock = Clock()
    quotas = Quotas(clock)
    tenant = limited(requests_per_minute=3, tokens_per_minute=50)
    for _ in range(3):
        quotas.admit(tenant, lambda: 1, 1).finish(1)
        clock.now += 1
    with pytest.raises(RateLimited) as refused:
        quotas.admit(tenant, lambda: 1, 1)
    headers = refused.value.headers
    assert refused.value.reason == "requests_per_minute"
    assert headers["x-ratelimit-remaining-requests"] == "0" and headers["Retry-After"] == "57"
    assert headers["x-ratelimit-reset-requests"] == "59s" and headers["x-ratelimit-remaining-tokens"] == "44"
    clock.now += 57
    quotas.admit(tenant, lambda: 1, 1)
    with pytest.raises(RateLimited, match="more than this key's limit"):
        Quotas(clock).admit(tenant, lambda: 40, 20)
    assert Quotas(clock).admit(Tenant("free"), lambda: 1 / 0, 10) is not None  # no token limit: never tokenizes


def test_a_request_any_size_would_be_refused_for_is_refused_early_with_admits_answer_and_nothing_taken():
    clock = Clock()
    quotas = Quotas(clock)
    tenant = limited(max_in_flight=1, requests_per_minute=5, tokens_per_minute=30)
    quotas.refuse_early(tenant)  # under every limit: let through, nothing taken
    held = quotas.admit(tenant, lambda: 10, 10)
    with pytest.raises(RateLimited) as early:
        quotas.refuse_early(tenant)
    with pytest.raises(RateLimited) as late:
        quotas.admit(tenant, lambda: 1, 1)
    assert early.value.reason == late.value.reason == "in_flight"
    assert early.value.headers == late.value.headers and quotas.in_flight() == {"t": 1}
    held.finish(0)  # charged its 10 prompt tokens: 20 of 30 left
    quotas.refuse_early(tenant)  # the token limit depends on the request's size: admit decides
    with pytest.raises(RateLimited, match="tokens per minute"):
        quotas.admit(tenant, lambda: 10, 11)
    for _ in range(4):
        quotas.admit(tenant, lambda: 0, 1).finish(0)
    with pytest.raises(RateLimited) as early:
        quotas.refuse_early(tenant)
    assert early.value.reason == "requests_per_minute" and early.value.headers["Retry-After"] == "60"
    quotas.refuse_early(Tenant("free"))  # no limits: never refused early


def test_reset_times_are_spelt_as_openai_spells_them():
    assert [duration(s) for s in (0.02, 1, 59.5, 60, 361.25)] == ["20ms", "1s", "59.5s", "1m0s", "6m1.25s"]
