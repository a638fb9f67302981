"""EitherMatcher: calls or an output format's document, each complete within the budget."""
from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from sampling.grammar import compile_grammar
from sampling.grammar.either import EitherMatcher
from server.tools import OPENING, parse_tools
from tests.test_grammar_support import EOG, VOCAB

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
CALLS = parse_tools([WEATHER], "auto", None).calls_schema()
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20},
                                           "score": {"type": "integer"}}, "required": ["answer", "score"]}
CALLS_GRAMMAR = compile_grammar(CALLS, VOCAB)


def either(format_schema):
    return EitherMatcher(CALLS_GRAMMAR.matcher(), compile_grammar(format_schema, VOCAB).matcher(),
                         OPENING.encode())


def tokens(text: bytes) -> list[int]:
    return [VOCAB.token_bytes.index(bytes([b])) for b in text]


def drive(m: EitherMatcher, rng: random.Random, budget: int, check_every_token: bool) -> tuple[bytes, int]:
    """Random allowed tokens until the document ends (half the time steered along the calls
    opening while allowed); every step keeps mask and is_allowed equal."""
    out, steps = b"", 0
    steer, opening = rng.random() < 0.5, OPENING.encode()
    while True:
        rem = budget - steps
        mask = m.allowed_mask(rem)
        allowed = np.flatnonzero(mask)
        assert allowed.size, f"stuck after {out!r}"
        if check_every_token:
            assert all(m.is_allowed(t, rem) == bool(mask[t]) for t in range(mask.size)), out
        if EOG in allowed and (rng.random() < 0.5 or allowed.size == 1):
            assert m.is_complete
            m.advance(EOG)
            return out, steps
        choices = allowed[allowed != EOG]
        along = [t for t in choices.tolist() if opening.startswith(out + VOCAB.token_bytes[t])]
        t = int(rng.choice(along if steer and along and len(out) < len(opening) else choices))
        m.advance(t)
        out += VOCAB.token_bytes[t]
        steps += 1
        if m.is_finished:
            return out, steps


def read(out: bytes, format_schema) -> str:
    """What a reader deciding by the opening sees: calls valid against the calls schema, or a
    document valid against the format (never a document that opens like calls)."""
    document = json.loads(out)
    if out.startswith(OPENING.encode()):
        jsonschema.validate(document, CALLS)
        return "calls"
    jsonschema.validate(document, format_schema or {"type": "object"})
    return "format"


@pytest.mark.parametrize("format_schema", [ANSWER, {"type": "object"}, {"type": "array", "items": {"type": "integer"}}])
def test_every_output_is_a_valid_call_or_format_document_within_the_budget(format_schema):
    rng = random.Random(7)
    needed = either(format_schema).min_tokens_to_complete()
    calls_needed = CALLS_GRAMMAR.matcher().min_tokens_to_complete()
    seen = set()
    for trial in range(60):
        budget = max(needed, calls_needed + rng.randint(-8, 30))  # at times too tight for a call
        m = either(format_schema)
        out, steps = drive(m, rng, budget, check_every_token=trial < 3)
        assert steps <= budget
        seen.add(read(out, format_schema))
    assert seen == {"calls", "format"}  # both alternatives were reachable


def test_a_tight_budget_leaves_only_what_finishes_in_time():
    answer = either(ANSWER)
    calls_needed = CALLS_GRAMMAR.matcher().min_tokens_to_complete()
    format_needed = compile_grammar(ANSWER, VOCAB).matcher().min_tokens_to_complete()
    assert answer.min_tokens_to_complete() == min(calls_needed, format_needed)
    # Both open with `{"`; with a budget only the format fits, the continuation is the format's.
    small = answer.min_tokens_to_complete()
    assert small < calls_needed
    for t in tokens(b'{"'):
        answer.advance(t)
    assert answer.which is None
    assert answer.is_allowed(tokens(b"a")[0], small - 2) and not answer.is_allowed(tokens(b"t")[0], small - 2)
    assert answer.is_allowed(tokens(b"t")[0], calls_needed)  # with enough budget, a call may begin


def test_completing_the_opening_commits_to_calls_and_only_within_the_calls_budget():
    anything = either({"type": "object"})  # any object: `{"tool_calls":[1]}` would be one
    for t in tokens(b'{"tool_calls":'):
        anything.advance(t)
    bracket = tokens(b"[")[0]
    calls_left = anything._first.min_tokens_to_complete()
    assert not anything.is_allowed(bracket, calls_left - 1)  # the format may not open a call it cannot finish
    assert not anything.allowed_mask(calls_left - 1)[bracket]
    assert anything.is_allowed(tokens(b"1")[0], calls_left - 1)  # the format's own value is fine
    assert anything.is_allowed(bracket, calls_left)
    twin = anything.fork()
    anything.advance(bracket)
    assert anything.which == "first" and not anything.is_allowed(tokens(b"1")[0])  # `[1` is no call
    assert twin.which is None  # a fork moves on its own
    twin.advance(tokens(b"1")[0])
    assert twin.which == "second" and twin.is_allowed(tokens(b"}")[0])


def test_diverging_from_the_opening_leaves_the_format_and_eog_needs_a_complete_document():
    m = either(ANSWER)
    with pytest.raises(ValueError, match="before either document"):
        m.advance(EOG)
    for t in tokens(b'{"answer":"hi","score":4}'):
        m.advance(t)
    assert m.which == "second" and m.is_complete and m.is_finished
    with pytest.raises(ValueError, match="neither"):
        either(ANSWER).advance(tokens(b"x")[0])


def test_forced_bytes_are_what_both_force():
    m = either(ANSWER)
    assert m.forced_bytes() == (b'{"', False)  # calls force `{"tool_calls":[{"name":...`, the format `{"answer":"`
    assert m.next_bytes_after(b'{"') >= {ord("t"), ord("a")}
    for t in tokens(b'{"a'):
        m.advance(t)
    assert m.forced_bytes() == (b'nswer":"', False)
