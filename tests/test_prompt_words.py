"""Structured answers' drafts from the prompt's words: the word being written is completed from
the one word of the prompt that begins the same way, and the engine verifies those drafts on the
real model (an extraction copies its values), for structured requests only."""
from __future__ import annotations

import json

import pytest

from bindings import Model
from engine import Engine, Request, speculation
from engine.drafts import PROMPT_WORDS
from engine.prompt_words import PromptWords
from engine.tuning import PROMPT_WORDS_WINDOW
from tests.test_speculation_model import NEAR_TIE_NATS
from sampling.params import SamplingParams

pytestmark = pytest.mark.model

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}


TEXTS = ["Tobias is a 34-year-old pilot who lives in Krakow.", "Ines is 71 and lives in Malmo.",
         "Our new colleague, Clara, aged 29, moved here from Bergen."]
PROMPTS = [f"Extract the person as JSON with the fields name, age and city.\n\n{t}\n\nJSON:" for t in TEXTS]


def assert_same_but_near_ties(off, on) -> None:
    """Greedy answers with drafts equal those without (asked with logprobs 2) but at a near-tie."""
    first = next((i for i, (a, b) in enumerate(zip(off.token_ids, on.token_ids)) if a != b), None)
    if first is None:
        assert on.token_ids == off.token_ids
    else:  # a step with draft rows has another shape, and no llama.cpp setting is batch invariant
        (_, best), (_, second) = off.logprobs[first].top[:2]
        assert best - second < NEAR_TIE_NATS, f"token {first} differs with a gap of {best - second:.3f} nats"


@pytest.fixture(scope="module")
def vocab(model_path):
    with Model(model_path, vocab_only=True) as model:
        yield model


@pytest.fixture(scope="module")
def words(vocab):
    return PromptWords(lambda text: vocab.tokenize(text, add_bos=False), vocab.token_bytes)


def _completion(vocab, words, prompt: str, written: str) -> bytes:
    prompt_ids = vocab.tokenize(prompt)
    tokens, _ = words.completion(words.of(prompt_ids), prompt_ids + vocab.tokenize(written, add_bos=False), 8)
    return b"".join(vocab.token_bytes[t] for t in tokens)


def test_the_word_being_written_is_completed_from_the_prompt_in_the_model_s_own_tokens(vocab, words):
    prompt = "Vera is a 18-year-old librarian who lives in Kraków."
    assert _completion(vocab, words, prompt, '{"city":"K') == "raków".encode()
    assert _completion(vocab, words, prompt, '{"age":1') == b"8"  # the word ends where the prompt's does
    assert _completion(vocab, words, prompt, '{"job":"libr') == b"arian"
    prompt_ids = vocab.tokenize(prompt)
    tokens, match = words.completion(words.of(prompt_ids), prompt_ids + vocab.tokenize('"libr', add_bos=False), 8)
    assert match == len(b"libr") and 1 <= len(tokens) <= 8


def test_a_prefix_that_is_a_whole_word_or_begins_different_words_proposes_nothing(vocab, words):
    prompt = "Kate is a nurse in Krakow; Kate's sister is a nurse too."
    assert _completion(vocab, words, prompt, '{"name":"K') == b""  # Kate or Krakow: a guess
    assert _completion(vocab, words, prompt, '{"city":"Kr') == b"akow"
    assert _completion(vocab, words, prompt, '{"job":"nurse') == b""  # the word may be done
    assert _completion(vocab, words, prompt, '{"job":"') == b""  # no word being written
    assert _completion(vocab, words, prompt, '{"job":"doc') == b""  # not in the prompt


def test_a_word_begun_before_the_window_proposes_nothing(vocab, words):
    long_word = "Pneumonoultramicroscopicsilicovolcanoconiosis"
    prompt = f"The patient has {long_word}, the doctor said."
    written = '{"illness":"' + long_word[:-3]
    assert len(vocab.tokenize(long_word[:-3], add_bos=False)) > PROMPT_WORDS_WINDOW
    assert _completion(vocab, words, prompt, written) == b""


@pytest.fixture(scope="module")
def extractions(model_path):
    """Three extractions, greedy, with and without drafts; then, with drafts, a request without a
    schema on the same prompt, and the engine's counts of drafts before and after it."""
    greedy = SamplingParams(temperature=0.0)
    results = {}
    for speculative in (False, True):
        with Engine(model_path, n_ctx=2048, max_running=4, speculative=speculative, prefix_cache=False) as engine:
            # Without drafts, with the top two alternatives, to see how close a differing choice was.
            logprobs = 0 if speculative else 2
            results[speculative] = [engine.submit(Request(p, max_tokens=48, sampling=greedy, format="json",
                                                          json_schema=PERSON, logprobs=logprobs)).result(120)
                                    for p in PROMPTS]
            if speculative:
                engine.inspect(lambda runner: None)  # the turn that answered them has published its stats
                results["stats"] = engine.stats().speculation
                results["plain"] = engine.submit(Request(PROMPTS[0], max_tokens=24, sampling=greedy)).result(120)
                engine.inspect(lambda runner: None)
                results["stats after plain"] = engine.stats().speculation
    return results


def test_an_extraction_drafts_its_values_from_the_prompt_and_keeps_its_output(extractions):
    for off, on in zip(extractions[False], extractions[True]):
        assert_same_but_near_ties(off, on)
    assert all(json.loads(r.text).keys() == PERSON["properties"].keys() for r in extractions[True])
    stats = extractions["stats"]
    assert stats.drafted[PROMPT_WORDS] > 0
    assert stats.accepted[PROMPT_WORDS] >= 0.5 * stats.drafted[PROMPT_WORDS]
    assert sum(r.metrics.accepted_tokens for r in extractions[True]) == sum(stats.accepted.values())


def test_a_request_without_a_schema_never_drafts_from_the_prompt_s_words(extractions):
    assert extractions["stats after plain"].drafted[PROMPT_WORDS] == extractions["stats"].drafted[PROMPT_WORDS]


def test_plain_steps_of_structured_answers_count_their_sampled_tokens_for_the_payoff(model_path):
    # Forced tokens (keys, punctuation) ride in the steps of JSON answers, fed whether a draft is
    # kept or not; the payoff weighs a draft against what a plain step samples: one token per
    # decoding sequence, never the forced ones appended after it.
    with Engine(model_path, n_ctx=2048, max_running=4, speculative=True, prefix_cache=False) as engine:
        handles = [engine.submit(Request(p, max_tokens=48, sampling=SamplingParams(temperature=0.0), format="json",
                                         json_schema=PERSON)) for p in PROMPTS]
        results = [h.result(120) for h in handles]
        plain = engine.inspect(lambda runner: {n: (rate.tokens.value, rate.steps)
                                               for n, rate in engine.core.speculator.payoff.plain.items()})
        forced = engine.stats().tokens_forced
    assert all(json.loads(r.text).keys() == PERSON["properties"].keys() for r in results)
    assert forced >= 3 * len(PERSON["properties"])  # each answer's keys at least
    assert sum(steps for _, steps in plain.values()) > 0 and min(plain) >= 2
    for decoding, (tokens, _) in plain.items():
        assert tokens <= decoding + 1e-9, f"{tokens:.2f} tokens per plain step of {decoding} sequences"


def test_drafted_tokens_the_grammar_forces_are_kept_without_logits_and_the_answers_stay_off_s(model_path, monkeypatch):
    # An extraction asked again is drafted from its first answer (recent outputs), through the keys
    # and punctuation the grammar forces: those tokens are kept as jump-forward would append them,
    # unsampled, and their rows carry no logits. Every proposal is granted whole here: whether a
    # draft pays at one stream depends on this machine's step times, which this test is not about.
    monkeypatch.setattr(speculation, "_a_certain_draft_pays", lambda *args, **kwargs: True)
    monkeypatch.setattr(speculation.Speculator, "allot",
                        staticmethod(lambda gains, *args, **kwargs: {seq: len(g) for seq, g in gains.items()}))
    greedy = SamplingParams(temperature=0.0)
    answers = {}
    for speculative in (False, True):
        with Engine(model_path, n_ctx=2048, max_running=4, speculative=speculative, prefix_cache=False) as engine:
            asked = [p for p in PROMPTS for _ in range(1 + speculative)]
            # Without drafts, with the top two alternatives, to see how close a differing choice was.
            answers[speculative] = [engine.submit(Request(p, max_tokens=48, sampling=greedy, format="json",
                                                          json_schema=PERSON, logprobs=0 if speculative else 2)).result(120)
                                    for p in asked]
            if speculative:
                forced = engine.inspect(lambda runner: engine.core.speculator.forced_draft_tokens)
                stats = engine.stats().speculation
    assert forced > 0
    # Rows with logits: a sampling row per drafted step and one per drafted token not forced.
    assert stats.verified_rows + forced <= sum(stats.drafted.values()) + stats.steps_with_drafts
    for i, off in enumerate(answers[False]):
        for on in answers[True][2 * i:2 * i + 2]:
            assert json.loads(on.text).keys() == PERSON["properties"].keys()
            assert_same_but_near_ties(off, on)
