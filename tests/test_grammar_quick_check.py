"""keywords.quick_checker: the validator shortcut for enum values under simple keywords agrees
with jsonschema wherever it answers."""
from __future__ import annotations

import jsonschema
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sampling.grammar import compile_grammar
from sampling.grammar.keywords import quick_checker
from sampling.grammar.schema import SchemaCompiler
from tests.test_grammar_support import VOCAB
from tests.test_grammar_keywords import accepts


def quick_check(value, schema):
    checker = quick_checker(schema)
    return None if checker is None else checker([value])[0]


scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-3, 3, allow_nan=False),
                    st.sampled_from([1.0, 2.0, -0.0]), st.text("ab1-", max_size=4))
values = st.one_of(scalars, st.lists(scalars, max_size=2), st.dictionaries(st.text("ab", max_size=2), scalars, max_size=2))
types = st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object"])
schemas = st.fixed_dictionaries({}, optional={
    "type": st.one_of(types, st.lists(types, min_size=1, max_size=3, unique=True)),
    "pattern": st.sampled_from(["^a", "b$", "1", "^[ab]+$", "a|-"]),
    "minLength": st.integers(0, 3), "maxLength": st.integers(0, 3),
    "enum": st.lists(scalars, min_size=1, max_size=3), "const": scalars,
    "description": st.just("an annotation"),
})


@settings(max_examples=400, deadline=None)
@given(values, schemas, st.sampled_from(["http://json-schema.org/draft-04/schema#",
                                         "https://json-schema.org/draft/2020-12/schema"]))
def test_quick_check_agrees_with_jsonschema(value, schema, draft):
    # Draft 4 has no `const`; the compiler enforces it anyway (a narrower, still valid reading).
    assume(not (draft.endswith("draft-04/schema#") and "const" in schema))
    answer = quick_check(value, schema)
    if answer is not None:
        full = {"$schema": draft, **schema}
        cls = jsonschema.validators.validator_for(full)
        assert answer == cls(full).is_valid(value), (value, schema)


def test_quick_check_leaves_other_keywords_to_the_validator():
    assert quick_check(3, {"minimum": 1}) is None
    assert quick_check(1.0, {"type": "integer"}) is None         # draft 4 and 6+ differ
    assert quick_check("ab", {"type": "string", "pattern": "^a", "maxLength": 2}) is True
    assert quick_check(True, {"enum": [1]}) is False              # true is not 1


def test_a_compile_reads_each_schema_once_for_all_its_values():
    # Enum values are checked against the same schema again and again; reading a long enum
    # again per check made compiles quadratic (twice so far). Within one compile only: a schema
    # dict may change between compiles.
    compiler = SchemaCompiler({})
    schema = {"enum": list(range(1000))}
    check = compiler._quick_checker(schema)
    assert check is compiler._quick_checker(schema) and check([999, 1000, 3]) == [True, False, True]
    assert SchemaCompiler({})._quick_checker(schema) is not check


@given(st.lists(values, max_size=6), schemas)
def test_a_batch_gives_each_value_its_own_verdict(batch, schema):
    checker = quick_checker(schema)
    assume(checker is not None)
    assert checker(batch) == [checker([v])[0] for v in batch]


def test_enum_branches_under_simple_siblings_keep_only_matching_values():
    names = [f"Task{i}@1" for i in range(40)]
    schema = {"type": "object", "properties": {"task": {"anyOf": [{"enum": [n], "description": n} for n in names]}},
              "additionalProperties": False, "required": ["task"],
              "anyOf": [{"properties": {"task": {"pattern": f"^{n}$"}}} for n in names[:3]]}
    g = compile_grammar(schema, VOCAB)
    assert accepts(g, {"task": "Task1@1"}) and not accepts(g, {"task": "Task7@1"})
    schema = {"anyOf": [{"enum": ["a", "bb"]}, {"const": 3}, {"type": "string"}], "maxLength": 1}
    g = compile_grammar(schema, VOCAB)
    assert accepts(g, "a") and accepts(g, "z") and accepts(g, 3) and not accepts(g, "bb")
