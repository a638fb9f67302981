"""Keywords real-world schemas use (issue 15): each one compiles, its output validates, and
instances walked through the grammar are accepted or rejected as JSON Schema says."""
from __future__ import annotations

import itertools
import json
import random
import re
import warnings

import jsonschema
import numpy as np
import pytest

from sampling.grammar import SchemaError, compile_grammar
from tests.test_grammar_support import VOCAB, drive


def accepts(grammar, instance) -> bool:
    """Whether the compact JSON text of `instance` (keys in its own order) is a complete document."""
    m = grammar.matcher()
    try:
        m.advance_bytes(json.dumps(instance, separators=(",", ":"), ensure_ascii=False).encode())
    except ValueError:
        return False
    return m.is_complete


def generated(schema, n=25, seed=0, **options):
    g = compile_grammar(schema, VOCAB, **options)
    rng = random.Random(seed)
    docs = [json.loads(drive(g, rng, budget=None)[0].decode()) for _ in range(n)]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    for d in docs:
        assert validator.is_valid(d), (schema, d, next(validator.iter_errors(d)).message)
    return g, docs


def test_required_name_without_additional_properties_is_satisfiable():
    # Regression: refused as "'b' is required but additionalProperties is false".
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}
    g, docs = generated(schema)
    assert accepts(g, {"b": 1}) and accepts(g, {"a": 2, "b": "x"})
    assert not accepts(g, {"a": 2}) and not accepts(g, {"a": 1, "b": 1, "c": 1})
    assert all("b" in d and set(d) <= {"a", "b"} for d in docs)
    with pytest.raises(SchemaError, match="required"):
        compile_grammar({**schema, "additionalProperties": False}, VOCAB)


def test_open_objects_follows_the_spec_for_absent_additional_properties():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    strict = compile_grammar(schema, VOCAB)
    spec = compile_grammar(schema, VOCAB, open_objects=True)
    assert accepts(strict, {"a": 1}) and not accepts(strict, {"a": 1, "zz": [1]})
    assert accepts(spec, {"a": 1, "zz": [1]}) and accepts(spec, {"q": None})
    assert not accepts(spec, {"a": "x"}) and not accepts(spec, {"a": 1, "a ": 1, "a": 2}.copy() | {"a": "s"})
    _, docs = generated(schema, n=40, seed=3, open_objects=True)
    assert any(set(d) - {"a"} for d in docs)      # extra members do get generated


@pytest.mark.parametrize("schema", [
    {"type": "string", "id": "x", "self": {"href": "/"}, "x-vendor": {"a": 1}, "_format": "date",
     "_uniqueItems": True, "markdownDescription": "m"},
    {"type": "object", "properties": {"a": {"$ref": "#/myDefs/n"}}, "required": ["a"],
     "myDefs": {"n": {"type": "integer", "minimum": 3}}},
])
def test_unknown_and_annotation_keywords_are_ignored(schema):
    generated(schema)


def test_siblings_of_ref_anyof_oneof_and_enum_are_intersected():
    schema = {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2, "minLength": 1}
    g, _ = generated(schema)
    assert accepts(g, "ab") and not accepts(g, "abc") and not accepts(g, "")
    schema = {"type": "object", "properties": {"k": {"type": "integer"}, "s": {"type": "string"}},
              "anyOf": [{"required": ["k"]}, {"required": ["s"]}]}
    g, _ = generated(schema)
    assert accepts(g, {"k": 1}) and accepts(g, {"s": "a"}) and not accepts(g, {})
    schema = {"type": "integer", "oneOf": [{"minimum": 5}, {"maximum": 2}]}
    g, _ = generated(schema)
    assert accepts(g, 7) and accepts(g, 1) and not accepts(g, 3) and not accepts(g, "7")
    schema = {"enum": ["a", "bb", "ccc", 4], "type": "string", "maxLength": 2, "not": {"const": "bb"}}
    g, docs = generated(schema)
    assert set(docs) == {"a"} and not accepts(g, "bb") and not accepts(g, 4)


@pytest.mark.parametrize("fmt,good,bad", [
    ("uri", "https://example.com/a/b?x=1", "not a uri"),
    ("uri-reference", "/a/b", "a b"),
    ("hostname", "a-b.example.org", "-bad-"),
    ("ipv6", "fe80::1", "1:2:3"),
    ("duration", "P1Y2M3DT4H", "P1H"),
    ("date-time", "2024-02-28T12:00:00Z", "2024-02-30T12:00:00Z"),
    ("json-pointer", "/a/0", "a"),
])
def test_formats(fmt, good, bad):
    g, _ = generated({"type": "string", "format": fmt})
    assert accepts(g, good) and not accepts(g, bad)


def test_unknown_formats_are_annotations():
    g, _ = generated({"type": "string", "format": "my-own-format"})
    assert accepts(g, "anything")


def test_pattern_and_format_with_length_bounds():
    g, docs = generated({"type": "string", "pattern": r"^[a-z0-9_\.]+$", "maxLength": 5})
    assert accepts(g, "ab.c") and not accepts(g, "abcdef") and not accepts(g, "")
    g, _ = generated({"type": "string", "format": "uuid", "maxLength": 36, "minLength": 36})
    assert accepts(g, "123e4567-e89b-12d3-a456-426614174000")
    # A repeated group that also matches "" (the JSON pointer format) under a minLength.
    g, docs = generated({"type": "string", "format": "json-pointer", "minLength": 1})
    assert accepts(g, "/a/b~0") and not accepts(g, "") and all(docs)
    g, _ = generated({"type": "string", "pattern": "(?:ab|c)*", "minLength": 1})
    assert accepts(g, "c") and accepts(g, "abc") and not accepts(g, "")
    # A group shorter than the bound: the pattern runs beside a character counter.
    g, docs = generated({"type": "string", "pattern": "^(?:ab|c)*$", "minLength": 2})
    assert accepts(g, "ab") and accepts(g, "cc") and not accepts(g, "c") and not accepts(g, "ax")
    with pytest.raises(SchemaError, match="combined with minLength"):   # past the counter's reach
        compile_grammar({"type": "string", "pattern": "(?:ab|c)*", "minLength": 200}, VOCAB)


def test_pattern_properties():
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}
    g, _ = generated(schema, n=40)
    assert accepts(g, {"name": "a", "x-a": 1, "x-b": 2}) and not accepts(g, {"x-a": "s"})
    assert not accepts(g, {"name": "a", "y": 1})
    # A declared name matching a pattern must satisfy both schemas.
    schema = {"type": "object", "properties": {"ab": {"type": "integer"}}, "required": ["ab"],
              "patternProperties": {"b": {"minimum": 3}}}
    g, docs = generated(schema)
    assert accepts(g, {"ab": 3}) and not accepts(g, {"ab": 2})
    # Spec mode: keys outside the pattern get additionalProperties, pattern keys their schema.
    schema = {"type": "object", "patternProperties": {"^n_": {"type": "number"}},
              "additionalProperties": {"type": "string"}}
    g, _ = generated(schema, n=40)
    assert accepts(g, {"n_1": 2, "other": "s"}) and not accepts(g, {"n_1": "s"})


def test_dependencies():
    schema = {"type": "object", "properties": {"card": {"type": "string"}, "billing": {"type": "string"},
                                               "n": {"type": "integer"}},
              "dependentRequired": {"card": ["billing"]}, "dependencies": {"n": {"required": ["card"]}}}
    g, docs = generated(schema, n=40)
    assert accepts(g, {"card": "1", "billing": "x"}) and not accepts(g, {"card": "1"})
    assert accepts(g, {"billing": "x"}) and not accepts(g, {"billing": "x", "n": 1})
    assert accepts(g, {"card": "1", "billing": "x", "n": 1})


def test_min_and_max_properties():
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"},
              "minProperties": 1, "maxProperties": 2}
    g, docs = generated(schema, n=40)
    assert not accepts(g, {}) and accepts(g, {"b": 1}) and accepts(g, {"a": 1, "c": 1})
    assert not accepts(g, {"a": 1, "b": 1, "c": 1})
    g, _ = generated({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2}, n=40)
    assert accepts(g, {"q": 1, "r": 2}) and not accepts(g, {"q": 1, "r": 2, "s": 3})


def test_unique_items():
    g, docs = generated({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True}, n=40)
    assert accepts(g, ["a", "c"]) and not accepts(g, ["a", "a"])
    g, _ = generated({"type": "array", "items": {"type": "string"}, "uniqueItems": True})
    assert accepts(g, ["x"]) and accepts(g, ["x", "y"]) and not accepts(g, ["x", "x"])
    g, docs = generated({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    assert accepts(g, [1, 2]) and not accepts(g, [1, 2, 1])
    assert all(len(d) <= 1 for d in docs)     # other items: read distinct, written one at a time


def test_additional_items_next_to_schema_items_is_ignored():
    g, _ = generated({"type": "array", "items": {"type": "integer"}, "additionalItems": False})
    assert accepts(g, [1, 2, 3])
    g, _ = generated({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                      "items": [{"type": "integer"}], "additionalItems": {"type": "string"}})
    assert accepts(g, [1, "a", "b"]) and not accepts(g, [1, 2])


def test_number_bounds():
    g, _ = generated({"type": "number", "exclusiveMinimum": 0, "maximum": 1.5})
    assert accepts(g, 0.5) and accepts(g, 1) and not accepts(g, 0) and not accepts(g, 2)
    assert not accepts(g, 0.0) and not accepts(g, -0.5)
    g, _ = generated({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number",
                      "minimum": 0, "exclusiveMinimum": True})
    assert accepts(g, 3) and not accepts(g, 0)
    # The largest double as a bound: drawn in to 40 digits (it used to nest 309 levels deep).
    for t in ("integer", "number"):
        g, _ = generated({"type": t, "minimum": -1.7976931348623157e308, "maximum": 1.7976931348623157e308})
        assert accepts(g, 10 ** 39) and accepts(g, -5) and not accepts(g, 10 ** 41)


def test_every_format_generates_what_the_installed_format_checkers_accept():
    from sampling.grammar.formats import FORMATS

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for fmt in FORMATS:
        g = compile_grammar({"type": "string", "format": fmt}, VOCAB)
        rng = random.Random(fmt)
        for _ in range(30):
            value = json.loads(drive(g, rng, budget=200)[0])
            assert checker.conforms(value, fmt), (fmt, value)


def test_regex_format_takes_common_expressions_and_writes_only_valid_ones():
    g, _ = generated({"type": "string", "format": "regex"}, n=0)
    good = ["^[a-zA-Z0-9_]{3,16}$", "^\\s*(it|describe)\\(\\s*['\"]([^'\"]+)['\"]", "^/api/(.*)$",
            r"\d+(?:\.\d+)?", "a|b", "((a)|b)c*?", "", "^$"]
    bad = ["a**", "[z-a]", "(", "a{3,1}", "(((a)))", "*a", "a$b", "[a||b]"]
    assert all(accepts(g, r) for r in good) and not any(accepts(g, r) for r in bad)
    rng = random.Random(3)
    shapes = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # FutureWarning: "possible set union" and the like
        for _ in range(300):
            value = json.loads(drive(g, rng, budget=60)[0])
            re.compile(value)
            shapes.update(c for c in "([|{?" if c in value)
    assert shapes == set("([|{?")                # groups, classes, alternation, counts were written


@pytest.mark.parametrize("pattern,good,bad", [
    ("^(?!@@)[@a-z]+$", ["a", "@a", "a@@"], ["@@", "@@a", "A"]),
    ("^(?!(False|None)$)[A-Za-z_]+$", ["x", "Falsey", "NoneX", "_"], ["False", "None", "1"]),
    ("^(?!a|bc$)[a-c]*", ["b", "bcc", "cab", ""], ["a", "ab", "bc"]),
    ("^(?=ab)[a-z]+", ["ab", "abc", "ab1"], ["ba", "a"]),
    ("^(?!x)(?!y)z?", ["z", "", "zx", "ax"], ["x", "yz"]),
])
def test_lookaheads_after_a_leading_caret(pattern, good, bad):
    for schema in ({"type": "string", "pattern": pattern},
                   {"type": "object", "patternProperties": {pattern: {"type": "integer"}}, "additionalProperties": False}):
        g, docs = generated(schema, n=40)
        wrap = (lambda s: s) if schema["type"] == "string" else (lambda s: {s: 1})
        assert all(accepts(g, wrap(s)) for s in good) and not any(accepts(g, wrap(s)) for s in bad)
        for d in docs:
            assert all(re.search(pattern, s) for s in ([d] if isinstance(d, str) else d))


def test_patterns_and_formats_within_length_bounds_run_beside_a_counter():
    g, docs = generated({"type": "string", "pattern": "a|bc", "minLength": 2, "maxLength": 5}, n=40)
    assert accepts(g, "xa") and accepts(g, "bcbc") and not accepts(g, "a") and not accepts(g, "bcbcbc")
    assert all(re.search("a|bc", d) and 2 <= len(d) <= 5 for d in docs)
    g, _ = generated({"type": "string", "format": "regex", "minLength": 1})
    assert accepts(g, "^/api/(.*)$") and not accepts(g, "")


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "number", "minimum": 0}, ["1e-06", "2.5E+10", "7e3"], ["-1e-06", "1e-400", "1e999"]),
    ({"type": "number", "exclusiveMinimum": 0}, ["1e-99", "3.25e2"], ["-2e1"]),
    ({"type": "number", "minimum": -5}, ["3e10"], []),
    ({"type": "number", "maximum": 0}, ["-1e3", "-4.5E-2"], ["1e3"]),
    ({"type": "number", "minimum": 1}, [], ["1e-06", "2e3"]),        # not every positive is >= 1
])
def test_exponents_where_a_bound_at_zero_allows_every_number_of_one_sign(schema, good, bad):
    g, docs = generated(schema, n=40)
    walk = lambda text: accepts_bytes(g, text.encode())
    assert all(walk(x) for x in good) and not any(walk(x) for x in bad)
    assert all(jsonschema.validate(json.loads(x), schema) is None for x in good)


def accepts_bytes(grammar, data: bytes) -> bool:
    m = grammar.matcher()
    try:
        m.advance_bytes(data)
    except ValueError:
        return False
    return m.is_complete


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "string", "pattern": "^[a-z]{1,200}$"}, ["a", "b" * 200], ["", "a" * 201, "A"]),
    ({"type": "string", "pattern": "^v[0-9]{40,}$"}, ["v" + "1" * 40, "v" + "2" * 99], ["v" + "1" * 39, "x" + "1" * 40]),
    ({"type": "string", "pattern": "^[a-z]+$", "minLength": 50, "maxLength": 60}, ["a" * 50, "z" * 60],
     ["a" * 49, "a" * 61]),
    ({"type": "string", "pattern": "^[^\\s]{33,40}$"}, ["é" * 33, "x" * 40], ["x" * 32, "a b" * 12]),
    ({"anyOf": [{"type": "string", "pattern": "^[a-z]{40,}$"}, {"type": "string", "pattern": "^[a-z]{50,60}$"}]},
     ["a" * 40], ["a" * 39]),      # two counters at one state: unrolled instead (CountConflict)
])
def test_a_class_repeated_past_32_is_counted_not_unrolled(schema, good, bad):
    g, docs = generated(schema, n=20)
    assert all(accepts(g, x) for x in good) and not any(accepts(g, x) for x in bad)
    rng = random.Random(1)
    for _ in range(10):
        text, steps = drive(g, rng, budget=90)
        assert steps <= 90 and jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))


@pytest.mark.parametrize("bounds", [
    {"minimum": 0.5}, {"exclusiveMinimum": 0.5}, {"maximum": 2.25}, {"exclusiveMaximum": 2.25},
    {"minimum": -2.5}, {"exclusiveMaximum": -1.5}, {"minimum": 0.1, "maximum": 0.9},
    {"exclusiveMinimum": -0.9, "exclusiveMaximum": -0.1}, {"exclusiveMinimum": 0, "maximum": 0.5},
    {"minimum": 1.05, "exclusiveMaximum": 3.5}, {"minimum": -0.25, "maximum": 0.75},
])
def test_decimal_bounds_are_exact_on_short_decimals(bounds):
    # Every decimal with up to 3 fraction digits near the bounds: accepted exactly when valid
    # (a bound inside a unit interval used to drop that whole interval, e.g. 0.5 >= 0.5).
    schema = {"type": "number", **bounds}
    g, _ = generated(schema, n=15)
    validator = jsonschema.Draft202012Validator(schema)
    for thousandths in range(-4000, 4001, 7):
        for value in (thousandths / 1000, round(thousandths / 100, 2), round(thousandths / 10, 1)):
            assert accepts(g, value) == validator.is_valid(value), (bounds, value)


def test_pattern_matches_anywhere_unless_anchored():
    rng = random.Random(0)
    for pattern, good, bad in [(r"\.km[xp]$", ["example.kmx", ".kmp"], ["example.kmx.zip"]),
                               ("[0-9]{2},", ["at 12, then", "12,"], ["1,2"]), ("^ab", ["abc"], ["cab"])]:
        g = compile_grammar({"type": "string", "pattern": pattern}, VOCAB)
        assert all(accepts(g, v) for v in good) and not any(accepts(g, v) for v in bad)
        for _ in range(10):   # with a budget: the free text around the match is unbounded
            assert re.search(pattern, json.loads(drive(g, rng, budget=40)[0]))


@pytest.mark.parametrize("pattern", [r"^ab$|^c", r"^a|b$", r"x|^y\$", r"^(a|b)$|[|]$", r"^[0-9]{2}$|^none$",
                                     r"^a|bc|x|RC|b$", r"ab|^c|y{2,}"])
def test_anchors_apply_to_their_own_branch(pattern):
    g = compile_grammar({"type": "string", "pattern": pattern}, VOCAB)
    words = ["", "ab", "abc", "c", "cab", "a", "xb", "b", "y$", "zy$", "x", "|", "a|", "12", "123", "none", "nones",
             "zbcz", "RC", "zRb", "yy", "zyyz", "ca", "zc"]
    for w in words:
        assert accepts(g, w) == bool(re.search(pattern, w)), (pattern, w)


@pytest.mark.parametrize("pattern", [r"[a-c]{2,255}", r"xa+", r"ab*", r"(ab){2,}", r"a|b{2,3}", r"c\\*", r"^a{1,40}",
                                     r"b{1,3}?", r"[a-c]{2,3}x"])
def test_a_trailing_quantifier_of_an_unanchored_pattern_needs_only_its_least_count(pattern):
    g = compile_grammar({"type": "string", "pattern": pattern}, VOCAB)
    assert g.n_states < 40          # 'x{1,255}' is not unrolled 255 times
    alphabet = "abcx\\"
    words = ["".join(w) for n in range(6) for w in itertools.product(alphabet, repeat=n)][:4000]
    for w in words:
        assert accepts(g, w) == bool(re.search(pattern, w)), (pattern, w)


def test_open_objects_reads_an_absent_type_as_any_type():
    schema = {"properties": {"a": {"type": "integer"}}, "minLength": 2}
    strict = compile_grammar(schema, VOCAB)
    assert accepts(strict, {"a": 1}) and accepts(strict, "xyz") and not accepts(strict, 3)
    assert not accepts(strict, [None])
    spec = compile_grammar(schema, VOCAB, open_objects=True)
    assert accepts(spec, {"a": 1}) and accepts(spec, "xyz") and accepts(spec, 3) and accepts(spec, [None])
    assert not accepts(spec, {"a": "s"}) and not accepts(spec, "x")


def test_extra_keys_may_hold_escapes_unless_a_declared_name_could_be_written_with_them():
    g, _ = generated({"type": "object", "additionalProperties": True, "properties": {"a/b": {"type": "integer"}}},
                     open_objects=True)
    assert accepts(g, {"a/b": 1, "Vendor\\Name\\": "src/", "say \"hi\"\n": 1})
    assert not accepts(g, {"a/b": "x"})
    g, _ = generated({"type": "object", "additionalProperties": {"type": "integer"},
                      "properties": {"a\\b": {"type": "string"}}})
    assert accepts(g, {"a\\b": "x"}) and not accepts(g, {"a\\b": 1}) and not accepts(g, {"x\\y": 1})


def test_pattern_extras_differ_from_the_declared_names_they_match():
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"basic": {"type": "integer"}},
              "patternProperties": {"^[a-z_]*$": {"type": ["integer", "string"]}}}
    g, docs = generated(schema, n=30, seed=2)
    assert accepts(g, {"basic": 1, "custom_label": "x"}) and accepts(g, {"other": 2})
    assert not accepts(g, {"custom": 1, "basic": 2})       # a declared name comes first, once
    with pytest.raises(ValueError):
        g.matcher().advance_bytes(b'{"basic":1,"basic"')
    assert any(set(d) - {"basic"} for d in docs)
    with_slash = compile_grammar({**schema, "properties": {"a/b": {"type": "integer"}},
                                  "patternProperties": {"^[a-z/]*$": {"type": "integer"}}}, VOCAB)
    assert not accepts(with_slash, {"a/b": 1, "cd": 2})    # a\\/b would also spell a/b: no extras


def test_a_refused_recursive_ref_under_a_dropped_pattern_leaves_no_hole():
    # Regression (whole-dataset run): the rule for the $ref stayed unfilled once its pattern's
    # extra members were dropped, and compiling crashed with "unknown IR node None".
    from sampling.grammar import UnsupportedSchemaError

    rule = {"type": "object", "properties": {"k": {"$ref": "#/definitions/r"}}, "not": {"required": ["z"]}}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False,
              "patternProperties": {"^x": {"$ref": "#/definitions/r"}}, "definitions": {"r": rule}}
    g, _ = generated(schema, n=5)
    assert accepts(g, {"a": 1}) and not accepts(g, {"a": 1, "xy": {}})
    with pytest.raises(UnsupportedSchemaError, match="'not'"):
        compile_grammar({**schema, "properties": {"a": {"$ref": "#/definitions/r"}}, "required": ["a"]}, VOCAB)


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "string", "format": "date", "pattern": "^2024"}, ["2024-01-05"], ["2023-01-05", "2024-13-05"]),
    ({"type": "string", "format": "email", "pattern": r"@example\.com$"}, ["a@example.com"], ["a@example.org", "example.com"]),
    ({"type": "string", "format": "uuid", "pattern": "^[0-9a-f-]+$", "maxLength": 36},
     ["123e4567-e89b-12d3-a456-426614174000"], ["123E4567-E89B-12D3-A456-426614174000"]),
])
def test_pattern_together_with_format_holds_both(schema, good, bad):
    g = compile_grammar(schema, VOCAB)
    assert all(accepts(g, v) for v in good) and not any(accepts(g, v) for v in bad)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    rng = random.Random(0)
    for _ in range(10):
        value = json.loads(drive(g, rng, budget=60)[0])
        assert validator.is_valid(value), (schema, value)


def keys_of(docs) -> set[tuple[str, ...]]:
    return {tuple(d) for d in docs}


def test_merged_members_follow_the_order_the_schema_is_written_in():
    # llguidance does the same, and real instances follow it: an allOf / $ref / anyOf written
    # before the schema's own properties puts its members first.
    inner = {"properties": {"a": {"type": "integer"}}, "required": ["a"]}
    own = {"properties": {"b": {"type": "integer"}}, "required": ["b"]}
    for schema, order in [({"allOf": [inner], **own}, ("a", "b")), ({**own, "allOf": [inner]}, ("b", "a")),
                          ({"$defs": {"i": inner}, "$ref": "#/$defs/i", **own}, ("a", "b")),
                          ({"$defs": {"i": inner}, **own, "$ref": "#/$defs/i"}, ("b", "a")),
                          ({"anyOf": [inner], **own}, ("a", "b")), ({**own, "anyOf": [inner]}, ("b", "a"))]:
        g, docs = generated({"type": "object", **schema})
        assert keys_of(docs) == {order}, schema
        assert accepts(g, dict(zip(order, (1, 2)))) and not accepts(g, dict(zip(order[::-1], (1, 2))))


def test_numbers_compare_by_value_in_enums_and_bounds():
    g, docs = generated({"enum": [2.0, "x"]})
    assert accepts(g, 2) and accepts(g, 2.0) and not accepts(g, 3)
    with pytest.raises(SchemaError, match="oneOf"):      # 2 and 2.0 are one value: not disjoint
        compile_grammar({"oneOf": [{"enum": [2]}, {"enum": [2.0, 3]}]}, VOCAB)
    g, _ = generated({"type": "number", "minimum": -5, "maximum": 10})
    assert all(accepts(g, v) for v in (10.0, 10, -5.0, -5, 9.5, -4.5))
    assert not any(accepts(g, v) for v in (10.5, -5.5, 11, -6))
    g, _ = generated({"type": "number", "minimum": 0, "exclusiveMaximum": 10})
    assert not accepts(g, 10.0) and accepts(g, 9.5)
    # const beside enum: the values they share, compared as values, not as text
    g, docs = generated({"const": 2, "enum": [2.0, 3]})
    assert all(d == 2 for d in docs) and accepts(g, 2) and not accepts(g, 3)
    g, _ = generated({"const": {"a": 1, "b": [1.0]}, "enum": [{"b": [1], "a": 1.0}, {"a": 2}]})
    assert accepts(g, {"b": [1], "a": 1.0}) and not accepts(g, {"a": 2})
    with pytest.raises(SchemaError, match="satisf"):
        compile_grammar({"const": True, "enum": [1]}, VOCAB)     # true is not 1


@pytest.mark.parametrize("fmt,good,bad", [
    ("uri", ["irc://example.com/channel", "ecdsa-koblitz-pubkey:14RZvYazz9H2DC2", "mailto:a@b.org",
             "https://en.wikipedia.org/wiki/Mass%E2%80%93energy", "file:///etc/hosts", "urn:isbn:0451450523",
             "http://user:pw@host:8080/a?b=c/d#frag"],
     ["/relative", "no scheme", "http://a b", "http://x/%zz", "1http://x"]),
    ("uri-reference", ["/hello/world", "a/b?c#d", "?q=1", "#top", "https://x.org"], ["a b", "%zz", "a:b c"]),
])
def test_uris_follow_rfc_3986(fmt, good, bad):
    g, _ = generated({"type": "string", "format": fmt}, n=40)
    assert all(accepts(g, u) for u in good) and not any(accepts(g, u) for u in bad)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    assert all(checker.conforms(u, fmt) for u in good)


def test_drafts_before_2019_ignore_the_keywords_beside_a_ref():
    base = {"definitions": {"obj": {"type": "object"}}, "properties": {"s": {"type": "string", "$ref": "#/definitions/obj"}}}
    old = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", **base}
    g, _ = generated(old)
    assert accepts(g, {"s": {"k": 1}}) and not accepts(g, {"s": "text"})
    with pytest.raises(SchemaError, match="satisf"):      # 2020-12: string and object at once
        compile_grammar({"type": "object", **base, "required": ["s"]}, VOCAB)


def test_anchors_inside_a_group_spanning_a_branch_are_anchors():
    schema = {"type": "object", "additionalProperties": False,
              "patternProperties": {r"(^.+\..+)|(^[a-zA-Z0-9_-]+)": {"type": "integer"}}}
    g, docs = generated(schema)
    assert accepts(g, {"example-bios-file": 1}) and accepts(g, {"a.b": 2}) and not accepts(g, {"!x": 1})
    g, _ = generated({"type": "string", "pattern": "(?:^ab)"})
    assert accepts(g, "abc") and not accepts(g, "cab")


def test_extra_members_count_as_one_towards_min_properties():
    # Extras may repeat each other's keys, never a declared member's: together they count once.
    g, docs = generated({"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1})
    assert accepts(g, {"a": "x"}) and accepts(g, {"a": "x", "b": "y"}) and not accepts(g, {})
    g, docs = generated({"type": "object", "properties": {"p": {"type": "integer"}},
                         "additionalProperties": {"type": "string"}, "minProperties": 2}, n=40)
    assert accepts(g, {"p": 1, "a": "x"}) and not accepts(g, {"p": 1}) and all(len(d) >= 2 for d in docs)


def test_schemas_differing_only_in_key_order_are_different_grammars():
    ab = {"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "required": ["a", "b"]}
    ba = {"type": "object", "properties": {"b": {"const": 2}, "a": {"const": 1}}, "required": ["a", "b"]}
    assert keys_of(generated(ab, n=3)[1]) == {("a", "b")} and keys_of(generated(ba, n=3)[1]) == {("b", "a")}


def test_open_objects_take_a_few_members_in_any_order_and_extras_anywhere():
    few = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                            "c": {"type": "boolean"}}, "required": ["a", "c"]}
    g = compile_grammar(few, VOCAB, open_objects=True)
    for order in itertools.permutations([("a", 1), ("b", "x"), ("c", True), ("zz", [None])]):
        assert accepts(g, dict(order))
    assert not accepts(g, {"c": True}) and not accepts(g, {"c": 1, "a": 1})
    m = g.matcher()
    with pytest.raises(ValueError):     # a member twice
        m.advance_bytes(b'{"a":1,"c":true,"a":2')
    _, docs = generated({**few, "additionalProperties": False}, n=40, open_objects=True)
    assert len(keys_of(docs)) > 3        # generated in several orders too
    assert keys_of(generated({**few, "additionalProperties": False}, n=10)[1]) <= {("a", "c"), ("a", "b", "c")}
    many = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefgh"}, "required": ["a", "h"]}
    g = compile_grammar(many, VOCAB, open_objects=True)
    assert accepts(g, {"$schema": "x", "a": 1, "b": 2, "zz": [1], "h": 3}) and accepts(g, {"a": 1, "h": 2, "q": 0})
    # Beyond 6 members: any order still, the required members tracked (each once, all needed),
    # the optional ones not (they may repeat, as extras may).
    assert accepts(g, {"h": 1, "c": 5, "a": 2}) and accepts(g, dict(zip("hgfedcba", range(8))))
    assert not accepts(g, {"$schema": "x", "a": 1}) and not accepts(g, {"h": 1, "b": "x", "a": 1})
    m = g.matcher()
    m.advance_bytes(b'{"b":1,"a":1,"b":2,"h":3}')       # a repeated optional member
    assert m.is_complete
    with pytest.raises(ValueError):                     # a required one twice
        g.matcher().advance_bytes(b'{"a":1,"h":3,"a":2')
    _, docs = generated({**many, "additionalProperties": False}, n=30, open_objects=True)
    assert {d and next(iter(d)) for d in docs} - {"a"}   # not always in the declared order


def test_past_the_any_order_budget_small_objects_track_only_their_required_members():
    # Each object of 6 long-named members would cost 63 sets x key bytes; the budget pays for one.
    names = [f"member_with_a_long_name_{i}" for i in range(6)]
    obj = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": [names[2]]}
    schema = {"type": "object", "properties": {f"o{i}": obj for i in range(4)}, "required": ["o3"]}
    g = compile_grammar(schema, VOCAB, open_objects=True)
    backwards = {n: 1 for n in reversed(names)}
    assert accepts(g, {"o0": backwards, "o3": backwards})
    assert not accepts(g, {"o3": {names[0]: 1}})            # the required member is still needed
    m = g.matcher()
    with pytest.raises(ValueError):                          # ... and still once
        m.advance_bytes(('{"o3":{"%s":1,"%s":2' % (names[2], names[2])).encode())


def test_a_pattern_member_answers_only_to_the_patterns_its_key_can_also_match():
    disjoint = {"type": "object", "additionalProperties": False, "required": ["RSRC"],
                "patternProperties": {"^BIOS$": {"type": "string", "pattern": "-sys$"},
                                      "^RSRC$": {"type": "string", "pattern": "-resource$"},
                                      "^/": {"type": "string"}, "^[^/A-Z]": {"type": "integer"}}}
    g = compile_grammar(disjoint, VOCAB)     # (a random walk through "-resource$" rarely ends)
    assert accepts(g, {"RSRC": "a-resource", "BIOS": "b-sys", "/x": "y", "zz": 1})
    assert not accepts(g, {"RSRC": "a-resource", "BIOS": "b-resource"})
    overlapping = {"type": "object", "additionalProperties": False,
                   "patternProperties": {"^a": {"type": "integer"}, "b": {"minimum": 5}}}
    g, docs = generated(overlapping, n=40)
    assert accepts(g, {"ab": 6}) and not accepts(g, {"ab": 3}) and not accepts(g, {"a": "x"})


def test_a_large_enum_is_one_rule_wherever_it_recurs():
    codes = [f"R{i:04d}" for i in range(600)]
    schema = {"type": "object", "properties": {k: {"enum": codes} for k in "abc"}, "required": list("abc"),
              "additionalProperties": False}
    g, _ = generated(schema, n=10)
    assert len(g.rule_start) == 2       # the document and the list, called three times
    assert accepts(g, {"a": "R0000", "b": "R0599", "c": "R0300"})
    assert not accepts(g, {"a": "R0600", "b": "R0000", "c": "R0000"}) and not accepts(g, {"a": "R0000"})


@pytest.mark.parametrize("letter", "dws")
def test_unicode_classes_are_the_code_points_pythons_regex_engine_matches(letter):
    from sampling.grammar.regex import _unicode_class

    ranges = _unicode_class(letter)
    starts = np.array([lo for lo, _ in ranges])
    rng = np.random.default_rng(0)
    edges = [x for lo, hi in ranges for x in (lo - 1, lo, hi, hi + 1)]     # every run's boundaries
    points = [int(c) for c in rng.integers(0, 0x110000, 20000)] + edges
    rx = re.compile("\\" + letter)
    for cp in points:
        if cp < 0 or cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
            continue
        i = np.searchsorted(starts, cp, side="right") - 1
        inside = i >= 0 and cp <= ranges[i][1]
        assert inside == bool(rx.match(chr(cp))), (letter, hex(cp))
