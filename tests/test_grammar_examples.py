"""Concrete schemas: the product review, a recursive tree, formats, patterns, budgets."""
from __future__ import annotations

import datetime
import ipaddress
import json
import random
import re
import uuid

import jsonschema
import numpy as np
import pytest

from sampling.grammar import compile_grammar
from tests.test_grammar_support import EOG, VOCAB, drive, standard

REVIEW = {"type": "object", "properties": {
    "rating": {"type": "integer", "minimum": 1, "maximum": 5},
    "pros": {"type": "array", "items": {"type": "string"}},
    "cons": {"type": "array", "items": {"type": "string"}},
    "summary": {"type": "string"}},
    "required": ["rating", "pros", "cons", "summary"]}

TREE = {"$defs": {"node": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 3},
    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
    "required": ["name", "children"]}}, "$ref": "#/$defs/node"}


def feed(grammar, text: bytes):
    m = grammar.matcher()
    for b in text:
        m.advance(b + 3)       # token id of the single byte b
    return m


def _generate_valid(schema, n=15, budget=60):
    g = compile_grammar(schema, VOCAB)
    for seed in range(n):
        out, steps = drive(g, random.Random(seed), budget=budget)
        value = json.loads(out.decode("utf-8"))
        jsonschema.validate(value, standard(schema))
        assert steps <= budget
        yield value


def test_review_outputs_validate():
    for v in _generate_valid(REVIEW):
        assert 1 <= v["rating"] <= 5


def test_review_rejects_bad_documents():
    g = compile_grammar(REVIEW, VOCAB)
    m = feed(g, b'{"rating":')
    assert not m.is_allowed(ord("0") + 3) and not m.is_allowed(ord("6") + 3)
    assert m.is_allowed(ord("5") + 3)
    m = feed(g, b'{"rating":5,"pros":[],"cons":[],"summary":"ok"}')
    assert m.is_complete and m.is_finished and m.is_allowed(EOG)
    with pytest.raises(ValueError):
        feed(g, b'{"pros":')                     # rating is required and comes first
    assert not feed(g, b'{"rating":5').allowed_mask()[EOG]


def test_recursive_tree():
    depths = []
    for v in _generate_valid(TREE, n=25, budget=80):
        def depth(node):
            return 1 + max((depth(c) for c in node["children"]), default=0)
        depths.append(depth(v))
    assert max(depths) >= 2
    g = compile_grammar(TREE, VOCAB)
    m = feed(g, b'{"name":"a","children":[{"name":"b","children":[]}')
    assert not m.is_complete and m.min_tokens_to_complete() == 2   # "]" then "}" (or "}]"?)


def test_recursive_any_value_json_object_mode():
    g = compile_grammar(None, VOCAB)
    for seed in range(20):
        out, _ = drive(g, random.Random(seed), budget=50)
        assert isinstance(json.loads(out.decode("utf-8")), dict)
    m = feed(g, b'{"a":[1,{"b":null}],"c":')
    assert not m.is_complete


@pytest.mark.parametrize("fmt,check", [
    ("date", datetime.date.fromisoformat),
    ("date-time", lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))),
    ("time", lambda s: datetime.time.fromisoformat(s.replace("Z", "+00:00"))),
    ("uuid", uuid.UUID),
    ("ipv4", ipaddress.IPv4Address),
    ("email", lambda s: re.fullmatch(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}", s) or 1 / 0),
])
def test_formats(fmt, check):
    for v in _generate_valid({"type": "string", "format": fmt}, n=10, budget=80):
        check(v)


@pytest.mark.parametrize("pattern", [
    r"^[A-Z]{2}-\d{3}$", r"(ab|cd)+x?", r"[^a-z\"]{1,4}", r"\w+@\w+\.com", r"a.c", r"[\d\-]+",
    r"(?:x|y){2,3}z*", r"\D\S", "é+中?",
])
def test_patterns(pattern):
    for v in _generate_valid({"type": "string", "pattern": pattern}, n=10, budget=40):
        assert re.search(pattern, v), (pattern, v)


def test_string_escapes_and_lengths():
    g = compile_grammar({"type": "string", "minLength": 2, "maxLength": 3}, VOCAB)
    assert feed(g, b'"\\n\\t"').is_complete       # counted strings: short escapes only (documented)
    assert feed(g, '"中😀"'.encode()).is_complete
    with pytest.raises(ValueError):
        feed(g, b'"\x01')                   # raw control characters are not JSON
    with pytest.raises(ValueError):
        feed(g, b'"abcd')
    with pytest.raises(ValueError):
        feed(g, b'"\xc3\x28')               # invalid UTF-8 continuation
    g2 = compile_grammar({"type": "string"}, VOCAB)
    assert feed(g2, b'"\\ud83d\\ude00\\u00e9"').is_complete
    assert feed(g2, b'"\\n\\u001f"').is_complete
    with pytest.raises(ValueError):
        feed(g2, b'"\\ud83d"')               # lone surrogate escape


def test_numbers_are_valid_json():
    g = compile_grammar({"type": "number"}, VOCAB)
    for bad in (b"01", b"-", b"1.", b".5", b"1e", b"+1"):
        m = g.matcher()
        try:
            for b in bad:
                m.advance(b + 3)
            assert not m.is_complete, bad
        except ValueError:
            pass
    for good in (b"0", b"-0.5", b"1e+10", b"12.25E-3"):
        assert feed(g, good).is_complete


def test_bounded_number():
    schema = {"type": "number", "exclusiveMinimum": -2.5, "maximum": 3}
    for v in _generate_valid(schema, n=30, budget=12):
        assert -2.5 < v <= 3


def test_tokens_crossing_terminals_and_eog():
    g = compile_grammar({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}},
                         "required": ["a"]}, VOCAB)
    m = g.matcher()
    tok = VOCAB.token_bytes.index(b'{"')
    assert m.is_allowed(tok)
    m.advance(tok)
    for piece in (b'a', b'":[', b'{}'):
        m.advance(VOCAB.token_bytes.index(piece))
    assert m.is_allowed(VOCAB.token_bytes.index(b'}]')) is False     # "}]" would close a non-open object
    assert m.is_allowed(VOCAB.token_bytes.index(b']'))
    m.advance(VOCAB.token_bytes.index(b']'))
    assert not m.is_allowed(EOG)
    m.advance(VOCAB.token_bytes.index(b'}'))
    assert m.is_allowed(EOG) and m.is_finished
    mask = m.allowed_mask()
    assert np.flatnonzero(mask).tolist() == [EOG]
    m.advance(EOG)
    assert not m.allowed_mask().any()


def test_compile_cache_is_near_free():
    import time
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 40}}}
    compile_grammar(schema, VOCAB)
    t = time.perf_counter()
    for _ in range(100):
        compile_grammar(json.loads(json.dumps(schema)), VOCAB)
    assert (time.perf_counter() - t) / 100 < 0.005
