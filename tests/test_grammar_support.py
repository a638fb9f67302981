"""Shared helpers for the grammar tests: a small synthetic vocabulary and a random driver."""
from __future__ import annotations

import copy
import random

import numpy as np

from sampling.grammar import compile_grammar
from sampling.vocabulary import TokenVocabulary

SPECIAL = (0, 2)
EOG = 1
_MULTI = [
    b'{"', b'":', b'},{', b'"}', b'"]', b'}]', b'],"', b'":[', b'","', b'":"', b'":{', b'[{', b'[]', b'{}',
    b'true', b'false', b'null', b'123', b'00', b'-1', b'.5', b'e+', b'abc', b'name', b'rating', b'id',
    b'\\n', b'\\u00', b'\\"', "é".encode(), "中".encode(), "😀".encode(), "😀"[0].encode()[:2],
    b"2024-", b"-01", b"T12:", b"@ex", b".com", b"a b",
]


def small_vocab() -> TokenVocabulary:
    """Specials 0 and 2 (empty bytes), EOG 1, every single byte, and some multi-byte tokens."""
    toks = [b"", b"", b""] + [bytes([i]) for i in range(256)] + _MULTI
    return TokenVocabulary(tuple(toks), frozenset({EOG}), frozenset(SPECIAL))


VOCAB = small_vocab()


def standard(schema):
    """The same schema in standard JSON Schema (OpenAPI `nullable` rewritten) for jsonschema."""
    if isinstance(schema, list):
        return [standard(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: standard(v) if k not in ("enum", "const", "required") else copy.deepcopy(v)
           for k, v in schema.items() if k != "nullable"}
    if "properties" in out:
        out["properties"] = {k: standard(v) for k, v in schema["properties"].items()}
    if schema.get("nullable") is True:
        return {"anyOf": [{"type": "null"}, out]}
    return out


def drive(grammar, rng: random.Random, budget: int | None, max_steps: int = 2000,
          check_every_token: bool = False) -> tuple[bytes, int]:
    """Pick uniformly random allowed tokens (random 'logits') until EOG; return (bytes, steps)."""
    m = grammar.matcher()
    out, steps = b"", 0
    while True:
        rem = None if budget is None else budget - steps
        mask = m.allowed_mask(rem)
        allowed = np.flatnonzero(mask)
        assert allowed.size, f"stuck after {out!r}"
        if check_every_token:
            for t in range(mask.size):
                assert m.is_allowed(t, rem) == bool(mask[t]), (t, out)
        if EOG in allowed and (rng.random() < 0.3 or steps > max_steps):
            assert m.is_complete
            return out, steps
        choices = allowed[allowed != EOG]
        if not choices.size:
            assert m.is_finished or m.is_complete
            return out, steps
        t = int(rng.choice(choices))
        assert m.is_allowed(t, rem)
        m.advance(t)
        out += VOCAB.token_bytes[t]
        steps += 1
        assert steps <= max_steps * 2, f"runaway generation {out[:200]!r}"


def test_vocab_shape():
    assert VOCAB.size == 3 + 256 + len(_MULTI)
    g = compile_grammar({"type": "boolean"}, VOCAB)
    mask = g.matcher().allowed_mask()
    assert not mask[list(SPECIAL)].any() and not mask[EOG]
