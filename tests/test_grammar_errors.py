"""Unsupported keywords and invalid schemas are reported, never silently ignored."""
from __future__ import annotations

import pytest

from sampling.grammar import SchemaError, UnsupportedSchemaError, compile_grammar
from tests.test_grammar_support import VOCAB


@pytest.mark.parametrize("schema,keyword,where", [
    ({"type": "number", "multipleOf": 0.5}, "multipleOf", "/"),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True, "minItems": 2}}},
     "uniqueItems", "/properties/a"),
    ({"not": {"type": "string"}}, "not", "/"),
    ({"if": {}, "then": {}}, "if", "/"),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames", "/"),
    ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties", "/"),
    ({"type": "object", "dependentSchemas": {"a": {}}}, "dependentSchemas", "/"),
    ({"type": "object", "minProperties": 100}, "minProperties", "/"),
    ({"type": "object", "dependentRequired": {k: ["z"] for k in "abcde"}}, "dependencies", "/"),
    ({"type": "array", "contains": {}}, "contains", "/"),
    ({"type": "string", "format": "color"}, "format", "/"),
    ({"type": "string", "pattern": "(?=a)b"}, "pattern", "/"),
    ({"type": "string", "pattern": r"(a)\1"}, "pattern", "/"),
    ({"type": "string", "pattern": r"a^b"}, "pattern", "/"),
    ({"type": "string", "pattern": "a|bc", "minLength": 100}, "pattern", "/"),
    ({"type": "string", "format": "date", "minLength": 70, "maxLength": 100}, "format", "/"),
    ({"type": "string", "pattern": r"^(?!\d)\w+$"}, "pattern", "/"),
    ({"type": "string", "pattern": "^a(?!b)"}, "pattern", "/"),
    ({"$ref": "http://example.com/s.json"}, "$ref", "/"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}, "oneOf", "/"),
    ({"items": {"not": {}}}, "not", "/items"),
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


def test_a_schema_past_the_compile_limit_is_refused_as_a_whole():
    big = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(12_000)}}
    for schema in (big,
                   # inside a pattern's value, where other errors only drop the pattern's members
                   {"type": "object", "patternProperties": {"^x": big}, "properties": {"a": {"type": "null"}}}):
        with pytest.raises(SchemaError, match="too large"):
            compile_grammar(schema, VOCAB, open_objects=True)
