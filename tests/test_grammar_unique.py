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


def test_strings_of_any_content_also_as_an_any_of_with_string_branches():
    schema = {"type": "array", "uniqueItems": True,
              "items": {"anyOf": [{"type": "string", "pattern": "^a"}, {"enum": ["x", "y"]}, {"type": "string"}]}}
    g = compile_grammar(schema, VOCAB)
    assert accepts(g, ["x", "y", "z"]) and not accepts(g, ["x", "z", "x"])



@pytest.mark.parametrize("items,distinct,repeat", [
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, ["x", 1, "1", 2], ["x", 2, "x"]),
    ({"type": "integer", "minimum": 1}, [1, 2, 3], [1, 2, 1.0]),
    ({"type": "object", "properties": {"n": {"type": "string"}, "v": {"type": "string"}}},
     [{"n": "a", "v": "1"}, {"n": "a", "v": "2"}, {"v": "1", "n": "b"}], [{"n": "a", "v": "1"}, {"v": "1", "n": "a"}]),
    ({"type": "string", "format": "uri"}, ["https://a.org/x", "https://a.org/y"], ["https://a.org/x", "https://a.org/x"]),
])
def test_other_items_are_read_distinct_but_written_one_at_a_time(items, distinct, repeat):
    schema = {"type": "array", "items": items, "uniqueItems": True}
    g = compile_grammar(schema, VOCAB, open_objects=True)
    assert accepts(g, distinct) and accepts(g, distinct[:1]) and accepts(g, [])
    assert not accepts(g, repeat)
    nested = compile_grammar({"type": "array", "items": schema}, VOCAB, open_objects=True)
    assert accepts(nested, [distinct, distinct[::-1]]) and not accepts(nested, [distinct, repeat])
    rng, validator = random.Random(3), jsonschema.Draft202012Validator(schema)
    for _ in range(40):
        out, _ = drive(g, rng, budget=g.matcher().min_tokens_to_complete() + rng.choice([0, 3, 20]))
        doc = json.loads(out)
        assert len(doc) <= 1 and validator.is_valid(doc), out


def test_items_called_as_a_rule_are_guarded_too():
    # maxItems past 16 makes the item a rule called once per item.
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 40}
    g = compile_grammar(schema, VOCAB)
    assert accepts(g, ["a", "b"]) and not accepts(g, ["a", "b", "a"])
    rng, validator = random.Random(4), jsonschema.Draft202012Validator(schema)
    for i in range(60):
        out, _ = drive(g, rng, budget=g.matcher().min_tokens_to_complete() + rng.choice([0, 2, 9]),
                       check_every_token=i % 10 == 0)
        assert validator.is_valid(json.loads(out)), out


def test_a_guarded_array_behind_shared_refs_and_alternatives():
    # The shape of asconfig.json, where a repeat once got through.
    schema = {"definitions": {"s": {"type": "string", "minLength": 1},
                              "list": {"type": "array", "uniqueItems": True, "items": {"$ref": "#/definitions/s"}},
                              "one_or_list": {"anyOf": [{"$ref": "#/definitions/s"}, {"$ref": "#/definitions/list"}]}},
              "type": "object", "properties": {"entries": {"$ref": "#/definitions/list"},
                                                "options": {"type": "object", "properties": {"lib": {"$ref": "#/definitions/one_or_list"}}},
                                                "targets": {"type": "object", "additionalProperties": {"$ref": "#/definitions/one_or_list"}}}}
    for open_objects in (False, True):
        g = compile_grammar(schema, VOCAB, open_objects=open_objects)
        assert accepts(g, {"entries": ["a", "b"], "options": {"lib": ["x", "y"]}})
        assert not accepts(g, {"entries": ["a", "a"]})
        assert not accepts(g, {"entries": ["a"], "options": {"lib": ["x", "x"]}})
    g = compile_grammar(schema, VOCAB, open_objects=True)
    assert accepts(g, {"targets": {"t": "x", "u": ["x", "y"]}}) and not accepts(g, {"targets": {"t": ["n", "n"]}})


def test_under_a_tight_budget_a_string_may_not_grow_into_an_earlier_item():
    g = compile_grammar({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, VOCAB)
    m = g.matcher()
    m.advance_bytes(b'["a,","a')
    tight = m.min_tokens_to_complete() + 1        # one token more than closing needs
    comma, b = VOCAB.token_bytes.index(b","), VOCAB.token_bytes.index(b"b")
    mask = m.allowed_mask(tight)
    assert not mask[comma] and not m.is_allowed(comma, tight)   # "a," would be a repeat, nothing spare
    assert mask[b] and m.allowed_mask()[comma]                  # "ab" is new; unbudgeted, "a," may grow
