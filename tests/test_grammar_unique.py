"""uniqueItems over strings of any content (issue 15): any number of items, kept distinct by the
matcher's guard (sampling/grammar/unique.py), within the token budget."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from sampling.grammar import compile_grammar
from tests.test_grammar_keywords import accepts
from tests.test_grammar_support import VOCAB, drive

TAGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
SCHEMAS = [
    {"type": "object", "properties": {"tags": TAGS}, "required": ["tags"]},
    {**TAGS, "minItems": 1},
    {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True, "maxItems": 5},
    {"type": "object", "properties": {"a": TAGS, "b": {"type": "array", "items": TAGS}}, "required": ["a", "b"]},
    {"anyOf": [TAGS, {"type": "array", "items": {"type": "string"}, "maxItems": 3}]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_generated_arrays_hold_distinct_strings_within_the_budget(schema):
    validator = jsonschema.Draft202012Validator(schema)
    several = 0
    for open_objects in (False, True):
        g = compile_grammar(schema, VOCAB, open_objects=open_objects)
        start, rng = g.matcher().min_tokens_to_complete(), random.Random(7)
        for i in range(150):
            budget = start + rng.choice([0, 1, 2, 3, 5, 8, 30])
            out, steps = drive(g, rng, budget=budget, check_every_token=i % 25 == 0)
            assert steps <= budget
            doc = json.loads(out)
            assert validator.is_valid(doc), out
            several += any(isinstance(v, list) and len(v) > 1 for v in (doc.values() if isinstance(doc, dict) else [doc]))
    assert several >= 3       # arrays of several strings were written


def test_repeats_are_refused_as_json_values():
    g = compile_grammar(SCHEMAS[0], VOCAB)
    assert accepts(g, {"tags": ["a", "b", "c"]}) and accepts(g, {"tags": []})
    assert not accepts(g, {"tags": ["a", "b", "a"]})
    m = g.matcher()
    m.advance_bytes(b'{"tags":["a","b",')
    with pytest.raises(ValueError):
        m.advance_bytes(b'"\\u0061"')         # "a" written with an escape is still "a"
    m.advance_bytes(b'"a\\n"]}')
    assert m.is_complete


def test_each_array_has_its_own_items():
    g = compile_grammar(SCHEMAS[3], VOCAB)
    assert accepts(g, {"a": ["x", "y"], "b": [["x", "y"], ["x"], ["y", "x"]]})
    assert not accepts(g, {"a": ["x"], "b": [["y"], ["z", "z"]]})


def test_an_ambiguous_parse_keeps_the_branch_that_allows_repeats():
    g = compile_grammar(SCHEMAS[4], VOCAB)
    assert accepts(g, ["a", "a"]) and accepts(g, ["a", "b", "c", "d"])
    assert not accepts(g, ["a", "b", "c", "a"])     # four items: only the distinct branch
