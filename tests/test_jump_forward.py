"""Jump-forward on the real model: forced text is appended unsampled in the model's tokenization,
the last token before free text is left to sampling, and every document stays valid and counted."""
import json

import jsonschema
import pytest

from bench.schemas import REVIEW_SCHEMA as REVIEW
from engine import Engine, FinishReason
from engine.jump_forward import JumpForward
from sampling.grammar import compile_grammar

pytestmark = pytest.mark.model

SUMMARY = {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 40}}, "required": ["summary"]}


def test_the_grammar_reports_the_bytes_it_forces(engine):
    matcher = compile_grammar(REVIEW, engine.vocabulary).matcher()
    assert matcher.forced_bytes() == (b'{"rating":', False)
    matcher.advance_bytes(b'{"rating":3')
    assert matcher.forced_bytes() == (b',"pros":[', False)
    matcher.advance_bytes(b',"pros":[')
    assert matcher.forced_bytes() == (b"", False)  # a string or the end of the array: a choice
    const = compile_grammar({"const": {"a": "hi"}}, engine.vocabulary).matcher()
    assert const.forced_bytes() == (b'{"a":"hi"}', True)


def test_the_last_forced_token_is_left_to_sampling_unless_the_document_ends(engine):
    model = engine.model
    jump = JumpForward(lambda text: model.tokenize(text, add_bos=False), model.token_bytes)
    matcher = compile_grammar(SUMMARY, engine.vocabulary).matcher()
    data, finishes = matcher.forced_bytes()
    assert data == b'{"summary":"' and not finishes
    canonical = model.tokenize(data.decode(), add_bos=False)
    forced = jump.forced_tokens(matcher)
    assert list(forced) == canonical[:-1]  # `"` may merge with the string's first characters
    spelled = b"".join(model.token_bytes[t] for t in forced)
    assert data.startswith(spelled) and spelled != data
    const = compile_grammar({"const": {"a": "hi"}}, engine.vocabulary).matcher()
    whole = jump.forced_tokens(const)
    assert b"".join(model.token_bytes[t] for t in whole) == b'{"a":"hi"}'


def test_a_held_back_token_is_appended_once_nothing_can_merge_with_it(engine):
    model = engine.model
    jump = JumpForward(lambda text: model.tokenize(text, add_bos=False), model.token_bytes)
    grammar = compile_grammar(REVIEW, engine.vocabulary)
    before_array = grammar.matcher()
    before_array.advance_bytes(b'{"rating":3,"pros')
    assert before_array.forced_bytes() == (b'":[', False)
    assert jump.forced_tokens(before_array) == ()  # `":["` runs past it: the array's first string
    before_digit = grammar.matcher()
    before_digit.advance_bytes(b'{"rating')
    assert before_digit.forced_bytes() == (b'":', False)
    assert [model.token_bytes[t] for t in jump.forced_tokens(before_digit)] == [b'":']  # no token joins `":` to a digit
    before_string = grammar.matcher()
    before_string.advance_bytes(b'{"rating":3,"pros":[],"cons":[],"summary')
    assert before_string.forced_bytes() == (b'":"', False)
    assert jump.forced_tokens(before_string) == ()  # an empty summary is spelled `":` + `""`


def test_a_fully_forced_document_needs_no_sampling(engine):
    before = engine.stats().tokens_forced
    r = engine.generate("Anything:", json_schema={"const": {"a": "hi"}}, max_tokens=32)[0]
    assert r.finish_reason is FinishReason.STOP
    assert r.text == '{"a":"hi"}' and r.structured_data == {"a": "hi"}
    assert r.metrics.forced_tokens == r.metrics.tokens_generated == len(r.token_ids) > 0
    assert r.metrics.ttft_ms is None  # no token was sampled
    assert engine.stats().tokens_forced - before == r.metrics.forced_tokens


@pytest.mark.parametrize("seed", range(4))
def test_forced_and_sampled_text_join_into_a_valid_document(engine, seed):
    # The key's closing quote and the string's opening one are where merges happen.
    handle = engine.submit("Summarise a film as JSON:", json_schema=SUMMARY, max_tokens=40,
                           temperature=1.0, top_k=40, seed=seed)
    deltas = "".join(handle.stream())
    r = handle.result(timeout=300)
    assert r.finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(r.text), SUMMARY)
    assert deltas == r.text
    assert b"".join(engine.model.token_bytes[t] for t in r.token_ids).decode() == r.text
    assert 0 < r.metrics.forced_tokens < r.metrics.tokens_generated


def test_review_documents_count_their_forced_tokens(engine):
    before = engine.stats().tokens_forced
    results = [h.result(timeout=600) for h in engine.submit_many(
        [f"Review of product {i} as JSON:" for i in range(6)], json_schema=REVIEW, max_tokens=48,
        temperature=0.8, top_k=40, seed=11)]
    for r in results:
        jsonschema.validate(json.loads(r.text), REVIEW)
        # {"rating": ,"pros":[ ,"cons":[ ,"summary":" } are forced, less the tokens before free text
        assert r.metrics.forced_tokens >= 4
    assert engine.stats().tokens_forced - before == sum(r.metrics.forced_tokens for r in results)


def test_a_tight_budget_can_leave_a_single_token(engine):
    matcher = compile_grammar({"enum": ["a", "abcdefghijklmnopqrstuvwxyz"]}, engine.vocabulary).matcher()
    matcher.advance_bytes(b'"a')
    assert matcher.forced_bytes() == (b"", False)  # close the string, or go on to the long value
    assert matcher.only_text(1) == b'"'  # one token left: it must close the string
    assert matcher.only_text(30) is None


def test_documents_at_their_smallest_budget_are_mostly_forced(engine):
    smallest = compile_grammar(REVIEW, engine.vocabulary).matcher().min_tokens_to_complete()
    for seed in range(3):
        r = engine.generate("Review as JSON:", json_schema=REVIEW, max_tokens=smallest, temperature=0.8, seed=seed)[0]
        assert r.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(r.text), REVIEW)
        assert r.metrics.tokens_generated <= smallest
        # Sampled: the rating's digit and the few places where several tokens fit the budget.
        assert r.metrics.forced_tokens >= r.metrics.tokens_generated - 5


def test_logprobs_requests_sample_every_token(engine):
    r = engine.generate("Review as JSON:", json_schema=REVIEW, max_tokens=32, logprobs=2)[0]
    jsonschema.validate(json.loads(r.text), REVIEW)
    assert r.metrics.forced_tokens == 0 and len(r.logprobs) == r.metrics.tokens_generated


def test_forced_chunks_fit_a_tiny_step_budget(model_path):
    # Four rows per step: forced tokens wait for room instead of overflowing the batch.
    with Engine(model_path, n_ctx=1024, max_running=4, step_token_budget=4, prefix_cache=False) as small:
        results = [h.result(timeout=600) for h in small.submit_many(
            ["Review as JSON:"] * 4, json_schema=REVIEW, max_tokens=40, temperature=0.7, seed=5)]
        for r in results:
            jsonschema.validate(json.loads(r.text), REVIEW)
        assert sum(r.metrics.forced_tokens for r in results) > 0
        assert small.stats().running == 0


def test_switched_off_it_forces_nothing(model_path):
    with Engine(model_path, n_ctx=1024, max_running=2, jump_forward=False, prefix_cache=False) as plain:
        r = plain.generate("Review as JSON:", json_schema=REVIEW, max_tokens=32, seed=1)[0]
        jsonschema.validate(json.loads(r.text), REVIEW)
        assert r.metrics.forced_tokens == 0 and plain.stats().tokens_forced == 0
