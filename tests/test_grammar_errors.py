"""Unsupported keywords and invalid schemas are reported, never silently ignored."""
from __future__ import annotations

import pytest

from sampling.grammar import SchemaError, UnsupportedSchemaError, compile_grammar
from tests.test_grammar_support import VOCAB


@pytest.mark.parametrize("schema,keyword,where", [
    ({"type": "integer", "multipleOf": 3}, "multipleOf", "/"),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, "uniqueItems", "/properties/a"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties", "/"),
    ({"not": {"type": "string"}}, "not", "/"),
    ({"if": {}, "then": {}}, "if", "/"),
    ({"type": "object", "minProperties": 1}, "minProperties", "/"),
    ({"type": "array", "contains": {}}, "contains", "/"),
    ({"type": "string", "format": "hostname"}, "format", "/"),
    ({"type": "string", "pattern": "(?=a)b"}, "pattern", "/"),
    ({"type": "string", "pattern": r"(a)\1"}, "pattern", "/"),
    ({"type": "string", "pattern": r"a^b"}, "pattern", "/"),
    ({"type": "string", "pattern": "ab", "maxLength": 3}, "pattern", "/"),
    ({"$ref": "http://example.com/s.json"}, "$ref", "/"),
    ({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a", "minLength": 2}, "$ref", "/"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}, "oneOf", "/"),
    ({"type": "string", "enum": ["a"], "maxLength": 3}, "enum", "/"),
    ({"items": {"dependentRequired": {}}}, "dependentRequired", "/items"),
])
def test_unsupported_keywords_are_named(schema, keyword, where):
    with pytest.raises(UnsupportedSchemaError) as e:
        compile_grammar(schema, VOCAB)
    assert repr(keyword) in str(e.value) and f"at {where}" in str(e.value)


@pytest.mark.parametrize("schema", [
    {"type": "strnig"},
    {"type": "object", "properties": []},
    {"type": "object", "required": "a"},
    {"enum": []},
    {"type": "string", "minLength": -1},
    {"type": "integer", "minimum": "3"},
    {"$ref": "#/$defs/missing"},
    {"type": "integer", "minimum": 5, "maximum": 4},
    {"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"},
    {"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"]}},
     "$ref": "#/$defs/n"},
    {"type": "string", "pattern": "(unclosed"},
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    42,
])
def test_invalid_schemas(schema):
    with pytest.raises(SchemaError):
        compile_grammar(schema, VOCAB)


def test_annotations_are_accepted_and_oneof_disjoint_is_fine():
    compile_grammar({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "t",
                     "description": "d", "examples": [1], "default": 1, "type": "integer"}, VOCAB)
    compile_grammar({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}, VOCAB)
    compile_grammar({"oneOf": [
        {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]}, VOCAB)
