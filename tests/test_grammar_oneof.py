"""oneOf on real-world shapes (issue 15): branches proven apart, narrowed or dropped so that no
generated document matches two branches; allOf over recursive references; multipleOf."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from sampling.grammar import UnsupportedSchemaError, compile_grammar
from tests.test_grammar_keywords import accepts, generated
from tests.test_grammar_support import VOCAB, drive


def test_an_untyped_object_branch_admits_strings_so_the_string_branch_is_dropped():
    # Under JSON Schema "abc" matches both branches (the first has no type), so it is invalid.
    schema = {"oneOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
                        {"type": "string"}]}
    for open_objects in (False, True):
        g, docs = generated(schema, n=20, open_objects=open_objects)
        assert all(isinstance(d, dict) for d in docs)
        assert not accepts(g, "abc") and accepts(g, {"a": 1})


def test_closed_object_branches_must_hold_a_member_only_they_allow():
    schema = {"oneOf": [{"properties": {"and": {"type": "array"}}, "additionalProperties": False},
                        {"properties": {"or": {"type": "array"}}, "additionalProperties": False}]}
    g, docs = generated(schema, n=20, open_objects=True)
    assert all(len(d) == 1 for d in docs)             # {} matches both: never written
    assert accepts(g, {"and": []}) and accepts(g, {"or": [1]})
    assert not accepts(g, {}) and not accepts(g, "x")


def test_an_optional_discriminator_is_made_required():
    base = {"type": "object", "properties": {"id": {"type": "string"}, "kind": {"enum": ["a", "b", "c"]}},
            "required": ["id"], "additionalProperties": False}
    schema = {"definitions": {"base": base},
              "oneOf": [{"allOf": [{"$ref": "#/definitions/base"}, {"properties": {"kind": {"pattern": "a"}}}]},
                        {"allOf": [{"$ref": "#/definitions/base"}, {"properties": {"kind": {"pattern": "^[bc]$"}}}]}]}
    g, docs = generated(schema, n=30, open_objects=True)
    assert all("kind" in d for d in docs)
    assert accepts(g, {"id": "x", "kind": "a"}) and accepts(g, {"kind": "c", "id": "y"})
    assert not accepts(g, {"id": "x"})


def test_string_branches_apart_by_their_patterns():
    schema = {"oneOf": [{"type": "string", "pattern": "^([a-zA-Z]:)?/(([^/]+/)*[^/]+)?$"},
                        {"type": "string", "pattern": "^@/(([^/]+/)*[^/]+)?$"},
                        {"type": "null"}]}
    g, _ = generated(schema, n=30)
    assert accepts(g, "/a/b") and accepts(g, "C:/x") and accepts(g, "@/p") and accepts(g, None)
    # Overlapping patterns, or classes only approximated by the automata, are not proven apart.
    for pair in (("^a", "b$"), (r"^\d+$", "^x")):
        with pytest.raises(UnsupportedSchemaError, match="'oneOf'"):
            compile_grammar({"oneOf": [{"type": "string", "pattern": p} for p in pair]}, VOCAB)


def test_overlapping_branches_that_cannot_be_narrowed_are_refused():
    for schema in ({"oneOf": [{"type": "integer"}, {"type": "number"}]},
                   {"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]}):
        with pytest.raises(UnsupportedSchemaError, match="'oneOf'"):
            compile_grammar(schema, VOCAB, open_objects=True)


def test_all_of_over_a_recursive_ref_is_merged_and_its_own_refs_stay_calls():
    # The shape of XState's machine schema: state nodes are a base node plus their own
    # members, and compound nodes hold further states.
    schema = {
        "definitions": {
            "base": {"type": "object", "properties": {"id": {"type": "string"},
                                                      "type": {"enum": ["atomic", "compound"]}},
                     "required": ["id", "type"]},
            "states": {"type": "object", "additionalProperties": {"oneOf": [
                {"allOf": [{"$ref": "#/definitions/base"},
                           {"properties": {"type": {"pattern": "atomic"}, "on": {"type": "string"}}}]},
                {"allOf": [{"$ref": "#/definitions/node"},
                           {"properties": {"type": {"pattern": "compound"}}}]}]}},
            "node": {"allOf": [{"$ref": "#/definitions/base"},
                               {"properties": {"states": {"$ref": "#/definitions/states"}}, "required": ["states"]}]},
        },
        "$ref": "#/definitions/node",
    }
    rng, validator = random.Random(0), jsonschema.Draft7Validator(schema)
    for open_objects in (False, True):
        g = compile_grammar(schema, VOCAB, open_objects=open_objects)
        for _ in range(10):
            out, _ = drive(g, rng, budget=g.matcher().min_tokens_to_complete() + 60)
            assert validator.is_valid(json.loads(out)), out
    doc = {"id": "m", "type": "compound", "states": {
        "s1": {"id": "s1", "type": "atomic", "on": "x"},
        "s2": {"id": "s2", "type": "compound", "states": {"t": {"id": "t", "type": "atomic"}}}}}
    assert jsonschema.Draft7Validator(schema).is_valid(doc) and accepts(g, doc)
    bad = {"id": "m", "type": "compound", "states": {"s1": {"id": "s1", "type": "compound"}}}
    assert not jsonschema.Draft7Validator(schema).is_valid(bad) and not accepts(g, bad)


def test_a_merge_that_would_inline_a_recursive_ref_inside_itself_is_refused():
    schema = {"$defs": {"a": {"type": "object", "properties": {
        "x": {"allOf": [{"$ref": "#/$defs/a"}, {"required": ["y"]}]}, "y": {"type": "integer"}}}},
        "$ref": "#/$defs/a"}
    with pytest.raises(UnsupportedSchemaError, match="recursive"):
        compile_grammar(schema, VOCAB)


@pytest.mark.parametrize("schema", [
    {"type": "integer", "multipleOf": 7},
    {"type": "number", "multipleOf": 5, "minimum": -23, "maximum": 101},
    {"type": "integer", "multipleOf": 16, "exclusiveMinimum": 0, "maximum": 256},
    {"type": "number", "multipleOf": 1.0, "minimum": 0.5},
])
def test_whole_multiple_of(schema):
    g, docs = generated(schema, n=30)
    validator = jsonschema.Draft7Validator(schema)
    for v in range(-300, 300):
        assert accepts(g, v) == validator.is_valid(v), v


def test_a_fractional_multiple_of_is_refused_by_name():
    # Validators divide in floating point: 0.3 is not a multiple of 0.1 for them.
    assert not jsonschema.Draft7Validator({"multipleOf": 0.1}).is_valid(0.3)
    with pytest.raises(UnsupportedSchemaError, match="'multipleOf'"):
        compile_grammar({"type": "number", "multipleOf": 0.1}, VOCAB)


def test_more_proofs_that_branches_are_apart():
    schemas = [
        # an enum whose every value the other branch's pattern refuses
        {"oneOf": [{"type": "string", "pattern": "^#[0-9a-f]{6}$"}, {"enum": ["red", "blue"]}]},
        # a member the other branch requires and this one (closed) never writes
        {"oneOf": [{"type": "object", "properties": {"p": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["p", "new"], "additionalProperties": False},
                   {"type": "object", "properties": {"p": {"type": "string"}, "old": {"type": "string"},
                                                     "new": {"type": "string"}},
                    "required": ["p", "old", "new"], "additionalProperties": False}]},
        # a required member no pattern of the other (closed) branch matches
        {"oneOf": [{"type": "object", "properties": {"ios": {"type": "string"}}, "required": ["ios"],
                    "additionalProperties": False},
                   {"type": "object", "patternProperties": {"^[0-9]x$": {"type": "string"}},
                    "additionalProperties": False, "minProperties": 1}]},
    ]
    for schema in schemas:
        g, docs = generated(schema, n=20, open_objects=True)
        validator = jsonschema.Draft202012Validator(schema)
        assert all(validator.is_valid(d) for d in docs)
    g = compile_grammar(schemas[0], VOCAB)
    assert accepts(g, "#00ff00") and accepts(g, "red") and not accepts(g, "green")
    g = compile_grammar(schemas[1], VOCAB, open_objects=True)
    assert accepts(g, {"p": "a", "new": "b"}) and accepts(g, {"old": "x", "p": "a", "new": "b"})


def test_a_false_pattern_takes_its_keys_away_from_the_other_patterns():
    schema = {"type": "object", "additionalProperties": False,
              "patternProperties": {".*": {"type": "array", "items": {"type": "string"}}, "forbidden": False}}
    g, docs = generated(schema, n=20, open_objects=True)
    assert accepts(g, {"a": ["x"], "b": []}) and not accepts(g, {"a": [], "my-forbidden": []})
    assert all("forbidden" not in k for d in docs for k in d)
