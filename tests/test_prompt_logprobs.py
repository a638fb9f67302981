"""Prompt logprobs from the engine equal llama-cpp-python's own `Llama(logits_all=True)` on the
same model and the same flash-attention setting (off, the Python Engine's default, and on,
`cobatch serve`'s), prompts long enough to be prefilled over several steps included; a scored
prompt is computed in full whatever the prefix cache holds."""
from __future__ import annotations

import numpy as np
import pytest

from bindings.high_level import ReferenceScorer
from engine import Engine, FinishReason, Request
from sampling.errors import InvalidParameterError

pytestmark = [pytest.mark.model, pytest.mark.slow]

STEP_BUDGET = 128  # prompts longer than this are prefilled over several steps
PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived an old fisherman. " * 6,  # ~ 2 steps
    "Q: What is 17 + 25?\nA: 42\n" * 25,  # ~ 3 steps
    "Ünïcödé têxt ✓ — 日本語のテキスト。 " * 8,
]


def reference_logprobs(scorer: ReferenceScorer, ids: list[int]) -> np.ndarray:
    """log softmax of each row at the next token, in float64 (written here, not the engine's code)."""
    logits = scorer.prompt_logits(ids).astype(np.float64)
    log_z = np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1)) + logits.max(axis=1)
    return np.array([logits[i, ids[i + 1]] - log_z[i] for i in range(len(ids) - 1)])


@pytest.fixture(scope="module", params=[False, True], ids=["flash-attn-off", "flash-attn-on"])
def scored(model_path, request):
    """Each prompt scored alone on an idle engine, and the reference's values, both with the same
    flash-attention setting. With it off (the Python Engine's default), cached prefixes and how
    the prompt is split into steps change nothing, so the prefix cache is on. With it on
    (`cobatch serve`'s default), llama.cpp's kernel sums over tiles of the cells present, so the
    reference reads the prompt in the engine's chunks (at most max_scored_rows per step) and the
    engine holds nothing cached."""
    flash_attn = request.param
    with Engine(model_path, n_ctx=2048, max_running=8, step_token_budget=STEP_BUDGET, flash_attn=flash_attn,
                prefix_cache=not flash_attn) as eng:
        results = [eng.submit(Request(prompt=p, max_tokens=0, prompt_logprobs=3)).result() for p in PROMPTS]
        chunk = eng.core.scheduler.max_scored_rows
    scorer = ReferenceScorer(model_path, n_ctx=512, flash_attn=flash_attn, n_batch=chunk if flash_attn else 512)
    try:
        references = [reference_logprobs(scorer, list(r.prompt_token_ids)) for r in results]
    finally:
        scorer.close()
    return results, references


def test_prompt_logprobs_equal_llama_logits_all(scored):
    results, references = scored
    assert max(len(r.prompt_token_ids) for r in results) > 2 * STEP_BUDGET  # chunked over 3 steps
    worst = 0.0
    for result, reference in zip(results, references):
        assert result.finish_reason is FinishReason.LENGTH and result.token_ids == () and result.text == ""
        assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == len(result.prompt_token_ids)
        got = np.array([e.logprob for e in result.prompt_logprobs[1:]])
        assert [e.token for e in result.prompt_logprobs[1:]] == list(result.prompt_token_ids[1:])
        worst = max(worst, float(np.abs(got - reference).max()))
    print(f"max abs difference from Llama(logits_all=True): {worst:.3g}")
    assert worst <= 1e-3


def test_top_alternatives_are_the_best_tokens_in_order(scored):
    results, _ = scored
    for entry in results[0].prompt_logprobs[1:]:
        logprobs = [lp for _, lp in entry.top]
        assert len(entry.top) == 3 and logprobs == sorted(logprobs, reverse=True)
        assert entry.logprob <= logprobs[0] + 1e-12
        assert entry.token != entry.top[0][0] or entry.logprob == logprobs[0]


def test_scored_prompt_is_computed_in_full_despite_the_prefix_cache(model_path):
    prompt = PROMPTS[3]
    with Engine(model_path, n_ctx=2048, max_running=8, step_token_budget=STEP_BUDGET) as eng:
        plain = eng.submit(Request(prompt=prompt, max_tokens=1)).result()
        n = plain.metrics.prompt_tokens
        before = eng.stats().tokens_prefilled
        again = eng.submit(Request(prompt=prompt, max_tokens=1)).result()
        assert again.metrics.cached_tokens > 0  # the cache serves an unscored prompt
        before = eng.stats().tokens_prefilled
        scored = eng.submit(Request(prompt=prompt, max_tokens=1, prompt_logprobs=0)).result()
        assert eng.stats().tokens_prefilled - before == n and scored.metrics.cached_tokens == 0
        assert scored.token_ids == plain.token_ids  # scoring changes nothing about the generation
        assert all(e is not None for e in scored.prompt_logprobs[1:])
        # A scored prompt does not wait for a leader computing the same prefix: both compute it.
        before = eng.stats().tokens_prefilled
        other = "A different opening line. " + prompt
        leader, follower = eng.submit_many([Request(prompt=other, max_tokens=1),
                                            Request(prompt=other, max_tokens=0, prompt_logprobs=1)])
        n_other = leader.result().metrics.prompt_tokens
        assert all(e is not None for e in follower.result().prompt_logprobs[1:])
        assert eng.stats().tokens_prefilled - before == 2 * n_other


def test_max_tokens_zero_needs_prompt_logprobs():
    with pytest.raises(InvalidParameterError) as err:
        Request(prompt="hi", max_tokens=0)
    assert err.value.field == "max_tokens"
    with pytest.raises(InvalidParameterError) as err:
        Request(prompt="hi", prompt_logprobs=21)
    assert err.value.field == "prompt_logprobs"
