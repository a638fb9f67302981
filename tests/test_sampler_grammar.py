"""Grammar-constrained sampling: the check-the-sampled-token-first fast path is exact."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sampling.sampler as sampler_module
from sampling.grammar import compile_grammar
from sampling.params import SamplingParams
from sampling.sampler import BatchSampler, NoAllowedTokenError, RowContext
from tests.test_grammar_support import VOCAB
from tests.test_sampler import FakeMatcher, chi_square, reference

N = VOCAB.size


def grammar_matcher():
    m = compile_grammar({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                        VOCAB).matcher()
    m.advance_bytes(b'{"id":')  # inside a number: digits, '-' and a few multi-byte tokens allowed
    return m


def logits_favouring_disallowed(matcher, seed):
    g = np.random.default_rng(seed)
    row = g.normal(0, 1, N).astype(np.float32)
    mask = matcher.allowed_mask()
    row[np.flatnonzero(~mask)[:6]] += 3.0  # much of the unmasked mass is on disallowed tokens
    row[np.flatnonzero(mask)[:4]] += 2.0
    return row, mask


def test_greedy_fast_path_equals_masked_argmax():
    m = grammar_matcher()
    fast, full = BatchSampler(N), BatchSampler(N, grammar_fast_paths=False)
    for seed in range(200):
        row, mask = logits_favouring_disallowed(m, seed)
        if seed % 2:
            row[np.flatnonzero(mask)[0]] += 10  # sometimes the argmax is allowed already
        ctx = RowContext(SamplingParams(), np.random.default_rng(0), matcher=m)
        a = fast.sample_rows(row[None].copy(), [ctx])[0]
        b = full.sample_rows(row[None].copy(), [ctx])[0]
        want = np.flatnonzero(mask)[np.argmax(row[mask])]
        assert a == b == want


# the mask as an id list (8192) and as a -inf bias vector added to the row (0)
@pytest.mark.parametrize("small_allowed,T", [(8192, 1.0), (0, 0.6)])
def test_temperature_fast_path_and_full_mask_have_the_masked_law(monkeypatch, small_allowed, T):
    monkeypatch.setattr(sampler_module, "_SMALL_ALLOWED", small_allowed)
    m = grammar_matcher()
    row, mask = logits_favouring_disallowed(m, 1)
    masked = np.where(mask, row, -np.inf)
    want = reference(masked, T)
    p = np.exp((row - row.max()) / T)
    q = p[~mask].sum() / p.sum()
    assert q > 0.3  # the redraw branch is taken often
    params = SamplingParams(temperature=T)
    for sampler in (BatchSampler(N), BatchSampler(N, grammar_fast_paths=False)):
        rng = np.random.default_rng(7)
        draws = [sampler.sample_rows(row[None].copy(), [RowContext(params, rng, matcher=m)])[0] for _ in range(12000)]
        counts = np.bincount(draws, minlength=N).astype(float)
        stat, bound = chi_square(counts, want)
        assert stat < bound, sampler.grammar_fast_paths
        # ... while a plausible wrong fast path (keep allowed draws, else the masked argmax) is rejected
        wrong = reference(row, T) * mask
        wrong[np.flatnonzero(mask)[np.argmax(row[mask])]] += q
        assert chi_square(counts, wrong)[0] > bound


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    density=st.sampled_from([0.0005, 0.01, 0.3, 0.99]),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    top_k=st.sampled_from([0, 1, 5, 100]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]),
    min_p=st.sampled_from([0.0, 0.05, 0.9]),
    small=st.booleans(),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
)
def test_masked_sampling_never_returns_a_disallowed_token(seed, density, temperature, top_k, top_p, min_p,
                                                          small, scale):
    vocab = 3000
    g = np.random.default_rng(seed)
    mask = g.random(vocab) < density
    mask[g.integers(vocab)] = True
    logits = (g.normal(0, scale, (3, vocab))).astype(np.float32)
    logits[:, np.flatnonzero(~mask)[:50]] += 5 * scale  # disallowed tokens dominate
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            presence_penalty=0.5, logit_bias={int(np.flatnonzero(mask)[0]): -100.0})
    old = sampler_module._SMALL_ALLOWED
    sampler_module._SMALL_ALLOWED = 8192 if small else 0
    try:
        matcher = FakeMatcher(mask)
        out = BatchSampler(vocab).sample_rows(
            logits, [RowContext(params, np.random.default_rng(i), [1, 2], matcher, 7) for i in range(3)])
    finally:
        sampler_module._SMALL_ALLOWED = old
    assert all(mask[t] for t in out)
    assert set(matcher.seen_remaining) == {7}


def test_a_dead_end_fails_only_its_row():
    vocab = 500
    logits = np.random.default_rng(0).normal(size=(3, vocab)).astype(np.float32)
    ok = FakeMatcher(np.ones(vocab, bool))
    dead = FakeMatcher(np.zeros(vocab, bool))
    ctxs = [RowContext(SamplingParams(), np.random.default_rng(0), matcher=ok),
            RowContext(SamplingParams(temperature=1.0), np.random.default_rng(0), matcher=dead),
            RowContext(SamplingParams(), np.random.default_rng(0), matcher=dead)]
    with pytest.raises(NoAllowedTokenError) as err:
        BatchSampler(vocab).sample_rows(logits, ctxs)
    assert err.value.rows == [1, 2]
    assert err.value.tokens.tolist() == [int(np.argmax(logits[0])), -1, -1]


def test_bias_vectors_are_cached_per_mask_object(monkeypatch):
    monkeypatch.setattr(sampler_module, "_SMALL_ALLOWED", 0)
    vocab = 400
    sampler = BatchSampler(vocab, mask_cache_size=2)
    masks = [np.random.default_rng(i).random(vocab) < 0.5 for i in range(3)]
    e0 = sampler._mask_entry(masks[0])
    assert sampler._mask_entry(masks[0]) is e0
    assert np.array_equal(e0.bias == 0, masks[0]) and np.all(np.isneginf(e0.bias[~masks[0]]))
    assert sampler._mask_entry(masks[0].copy()) is not e0  # a different object, even if equal
    sampler._mask_entry(masks[1])
    sampler._mask_entry(masks[2])
    assert len(sampler._masks) == 2
    with pytest.raises(ValueError, match="shape"):
        sampler._mask_entry(np.ones(vocab + 1, bool))


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    density=st.sampled_from([0.02, 0.3, 0.9, 1.0]),
    top_k=st.sampled_from([1, 5, 40, 200]),
    top_p=st.sampled_from([1.0, 0.9]),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
)
def test_top_k_from_the_best_columns_equals_masking_the_whole_row(seed, density, top_k, top_p, scale):
    vocab = 5000
    g = np.random.default_rng(seed)
    mask = g.random(vocab) < density
    mask[g.integers(vocab)] = True
    row = g.normal(0, scale, vocab).astype(np.float32)
    row[np.flatnonzero(~mask)[:30]] += 4 * scale  # disallowed tokens crowd the top columns
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
    old = sampler_module._SMALL_ALLOWED
    sampler_module._SMALL_ALLOWED = 0  # the mask as a whole-row vector, the path under test
    try:
        fast, full = BatchSampler(vocab), BatchSampler(vocab, grammar_fast_paths=False)
        found = fast._top_k_allowed(row, top_k, mask)
        if found is not None:
            allowed = np.flatnonzero(mask)
            want = allowed[np.argsort(-row[allowed], kind="stable")[:top_k]]
            assert found[1].tolist() == want.tolist()
            assert found[0].tolist() == row[want].tolist()
        for i in range(4):
            ctx = RowContext(params, np.random.default_rng(i), matcher=FakeMatcher(mask))
            ctx_full = RowContext(params, np.random.default_rng(i), matcher=FakeMatcher(mask))
            assert fast.sample_rows(row[None].copy(), [ctx]) == full.sample_rows(row[None].copy(), [ctx_full])
    finally:
        sampler_module._SMALL_ALLOWED = old


def test_top_k_from_the_best_columns_is_taken_for_a_dense_mask():
    vocab = 5000
    g = np.random.default_rng(0)
    mask = g.random(vocab) < 0.9
    row = g.normal(0, 1, vocab).astype(np.float32)
    found = BatchSampler(vocab)._top_k_allowed(row, 40, mask)
    assert found is not None and len(found[1]) == 40 and mask[found[1]].all()
    assert BatchSampler(vocab)._top_k_allowed(row, 40, np.eye(1, vocab, 7, dtype=bool)[0]) is None
