"""JSON-Schema-constrained generation on the real model: every output valid, even under a tight
token budget, mixed in one batch with unconstrained requests."""
import json

import jsonschema
import pytest

from bench.schemas import REVIEW_SCHEMA as REVIEW
from engine import FinishReason, InvalidParameterError

pytestmark = pytest.mark.model

TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8},
                           "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
            "required": ["name", "children"],
        }
    },
    "$ref": "#/$defs/node",
}


def test_sixteen_concurrent_requests_mixed_with_unconstrained_ones_are_all_valid(engine):
    constrained = [
        ("Review of a cheap umbrella as JSON:", REVIEW),
        ("A family tree as JSON:", TREE),
    ] * 8
    handles = [engine.submit(p, json_schema=s, max_tokens=48, temperature=0.8, top_k=40, top_p=0.9, seed=i)
               for i, (p, s) in enumerate(constrained)]
    free = engine.submit_many(["Tell me about rivers:", "Write a poem:"], max_tokens=16)
    for h, (_, schema) in zip(handles, constrained):
        r = h.result(timeout=600)
        assert r.finish_reason is FinishReason.STOP, r
        document = json.loads(r.text)
        jsonschema.validate(document, schema)
        assert r.structured_data == document
    assert all(h.result(timeout=600).structured_data is None for h in free)


@pytest.mark.parametrize("max_tokens", [14, 16, 20])  # 14: the shortest REVIEW document
def test_a_tight_budget_still_gives_complete_valid_json(engine, max_tokens):
    r = engine.generate("Review as JSON:", json_schema=REVIEW, max_tokens=max_tokens,
                        temperature=1.0, seed=7)[0]
    assert r.metrics.tokens_generated <= max_tokens
    jsonschema.validate(json.loads(r.text), REVIEW)


TAGS = {"type": "object", "required": ["tags"],
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 30}}}


@pytest.mark.parametrize("max_tokens", [5, 9, 40])   # 5: the shortest TAGS document
def test_distinct_strings_on_the_real_model_within_the_budget(engine, max_tokens):
    # A prompt inviting repeats; the matcher's guard (sampling/grammar/unique.py) refuses them.
    handles = [engine.submit('Tags, the same one again and again: {"tags":["a","a","a"', json_schema=TAGS,
                             max_tokens=max_tokens, temperature=1.0, seed=seed) for seed in range(4)]
    for h in handles:
        r = h.result(timeout=600)
        assert r.metrics.tokens_generated <= max_tokens
        jsonschema.validate(json.loads(r.text), TAGS)


def test_json_object_mode_gives_an_object(engine):
    r = engine.generate("Describe a cat as JSON:", format="json", max_tokens=24)[0]
    assert isinstance(json.loads(r.text), dict) and r.structured_data == json.loads(r.text)


@pytest.mark.parametrize(
    "schema,needle",
    [({"type": "string", "format": "color"}, "format"),
     ({"type": "array", "uniqueItems": True, "minItems": 2}, "uniqueItems"),
     ({"type": "object", "propertyNames": {"maxLength": 2}}, "propertyNames"),
     ({"type": "wrong"}, "wrong")],
)
def test_unsupported_or_invalid_schema_is_a_clear_error_and_changes_nothing(engine, schema, needle):
    with pytest.raises(InvalidParameterError, match=needle):
        engine.submit("x", json_schema=schema, max_tokens=16)
    assert engine.stats().running == 0


def test_budget_below_the_shortest_document_is_refused(engine):
    with pytest.raises(InvalidParameterError, match="max_tokens"):
        engine.submit("x", json_schema=REVIEW, max_tokens=3)
