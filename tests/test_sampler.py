"""The batched sampler against brute-force references on random logits."""
import numpy as np
import pytest

import sampling.sampler as sampler_module
from sampling.params import SamplingParams
from sampling.penalties import apply_logit_edits
from sampling.sampler import BatchSampler, RowContext

V = 5000  # not a multiple of the column grid, so the tail tokens are exercised


def rows(n, seed=0, vocab=V):
    return np.random.default_rng(seed).normal(0, 3, size=(n, vocab)).astype(np.float32)


def reference(row, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The law by sorting the whole row: temperature, top-k, top-p, min-p, renormalise."""
    x = row.astype(np.float64) / temperature
    order = np.argsort(-x, kind="stable")
    if top_k:
        order = order[:top_k]
    w = np.exp(x[order] - x[order[0]])
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(w / w.sum()), top_p)) + 1
        order, w = order[:keep], w[:keep]
    if min_p > 0.0:
        keep = w >= min_p  # w is relative to the most likely token
        order, w = order[keep], w[keep]
    probs = np.zeros(row.size)
    probs[order] = w / w.sum()
    return probs


def chi_square(counts, probs):
    """(statistic, bound): Pearson chi-square over outcomes pooled to expected counts >= 5.

    Under the right law the statistic has mean df and sd sqrt(2 df); the bound is 6 sd above
    the mean, so with fixed seeds a correct sampler passes and a wrong law fails."""
    n = counts.sum()
    expected = probs * n
    assert np.all(counts[probs == 0] == 0), "sampled an outcome of probability 0"
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # merge a small pooled bucket into the smallest big one
        i = int(np.argmin(exp[:-1]))
        obs[i] += obs[-1]
        exp[i] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = max(obs.size - 1, 1)
    return stat, df + 6 * np.sqrt(2 * df)


def test_chi_square_has_power():
    probs = np.array([0.5, 0.3, 0.2])
    counts = np.random.default_rng(0).multinomial(20000, probs).astype(float)
    stat, bound = chi_square(counts, probs)
    assert stat < bound
    stat, bound = chi_square(counts, np.array([0.48, 0.32, 0.2]))
    assert stat > bound


def test_greedy_is_argmax_for_every_row():
    logits = rows(6)
    out = BatchSampler(V).sample_rows(logits, [RowContext(SamplingParams(), np.random.default_rng(0))] * 6)
    assert out.tolist() == np.argmax(logits, axis=1).tolist()


@pytest.mark.parametrize("k", [1, 5, 40, 300, 4999, 6000])
def test_top_k_is_exact(k):
    logits = rows(4, seed=k)
    logits[0, -3:] = 50.0  # the largest values sit in the tail outside the column grid
    logits[1, ::7] = -np.inf  # masked entries are never returned
    sampler = BatchSampler(V)
    for row in logits:
        values, ids = sampler.top_k(row, k)
        finite = np.sort(row[np.isfinite(row)])[::-1]
        expected = finite[:k]
        assert np.array_equal(values, expected)
        assert np.array_equal(row[ids], values)
        assert len(set(ids.tolist())) == len(ids)


@pytest.mark.parametrize("vocab,scale,T,top_p", [(5000, 3, 1.0, 0.9), (70000, 3, 1.0, 0.9),
                                                 (70000, 1, 0.5, 0.5), (70000, 6, 2.0, 0.99),
                                                 (70000, 0.01, 1.0, 0.7)])
def test_nucleus_is_exact(vocab, scale, T, top_p):
    row = (np.random.default_rng(vocab).normal(0, 1, vocab) * scale).astype(np.float32)
    sampler = BatchSampler(vocab)
    got = sampler._nucleus(row, float(row.max()), T, top_p)
    want = np.flatnonzero(reference(row, T, top_p=top_p))
    assert len(got) == len(set(got.tolist()))
    assert set(got.tolist()) == set(want.tolist())


def empirical(sampler, logits_row, params, n=4000):
    rng = np.random.default_rng(123)
    counts = np.zeros(logits_row.size)
    for _ in range(n):
        counts[sampler.sample_rows(logits_row[None, :], [RowContext(params, rng)])[0]] += 1
    return counts / n


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [(0.7, 40, 0.9, 0.0), (1.0, 10, 1.0, 0.0), (1.5, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.0),
     (1.0, 0, 1.0, 0.01), (2.0, 30, 1.0, 0.05), (1.0, 0, 0.95, 0.02), (0.8, 50, 0.9, 0.1)],
)
def test_sampling_matches_reference_distribution(temperature, top_k, top_p, min_p):
    logits_row = rows(1, seed=7)[0] * 0.8
    logits_row[:20] += 9.0  # a clear head so the distribution is measurable in few draws
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    got = empirical(BatchSampler(V), logits_row, params)
    want = reference(logits_row, temperature, top_k, top_p, min_p)
    assert np.all(got[want == 0] == 0), "sampled a token outside the allowed set"
    # Compare the 20 head tokens one by one and the rest as one bucket: with 4,000 draws the
    # total variation distance over these 21 outcomes is well under 0.05 unless the law is wrong.
    bucket = lambda p: np.append(p[:20], p[20:].sum())  # noqa: E731
    assert 0.5 * np.abs(bucket(got) - bucket(want)).sum() < 0.05


@pytest.mark.parametrize("rounds", [4, 0])  # rejection sampling, and the exact fallback alone
@pytest.mark.parametrize("vocab,T", [(300, 1.0), (300, 0.3), (4096, 2.0)])
def test_plain_temperature_draw_is_the_softmax(monkeypatch, rounds, vocab, T):
    monkeypatch.setattr(sampler_module, "_REJECTION_ROUNDS", rounds)
    g = np.random.default_rng(vocab)
    row = g.normal(0, 1, vocab).astype(np.float32)
    row[g.choice(vocab, 12, replace=False)] += 4.0
    row[-1] += 5.0  # a heavy tail token (outside the column grid when vocab % 16 != 0)
    row[3] = -np.inf
    sampler, rng = BatchSampler(vocab), np.random.default_rng(1)
    counts = np.bincount([sampler._draw_full(row, T, rng) for _ in range(20000)], minlength=vocab)
    stat, bound = chi_square(counts.astype(float), reference(row, T))
    assert stat < bound


def test_same_seed_same_tokens_and_rows_do_not_share_randomness():
    logits = np.repeat(rows(1, seed=3), 3, axis=0)
    params = [SamplingParams(temperature=1.0, top_k=50, seed=9)] * 3
    sampler = BatchSampler(V)

    def draw(seeds):
        return sampler.sample_rows(logits, [RowContext(p, np.random.default_rng(s)) for p, s in zip(params, seeds)]).tolist()

    assert draw([1, 2, 3]) == draw([1, 2, 3])
    seq = [sampler.sample_rows(logits[:1], [RowContext(params[0], np.random.default_rng(5))])[0] for _ in range(5)]
    assert len(set(seq)) == 1  # a fresh generator with one seed always starts the same
    many = [tuple(draw([s, s + 100, s + 200])) for s in range(20)]
    assert any(len(set(t)) > 1 for t in many)  # different generators give different tokens


def dense_edits(row, params, generated):
    x = row.copy()
    for t, b in params.logit_bias:
        x[t] += np.float32(b)
    counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=row.size)
    seen = counts > 0
    r = np.float32(params.repetition_penalty)
    x = np.where(seen, np.where(x > 0, x / r, x * r), x).astype(np.float32)
    x -= (params.presence_penalty * seen + params.frequency_penalty * counts).astype(np.float32)
    return x


@pytest.mark.parametrize("rep,pres,freq,bias", [
    (1.3, 0.0, 0.0, {}), (1.0, 0.7, 0.0, {}), (1.0, 0.0, -0.4, {}), (0.8, -1.5, 1.2, {3: 5.0, 4999: -100.0}),
    (1.0, 0.0, 0.0, {0: 2.5, 17: -1.0}), (1.1, 0.5, 0.5, {})])
def test_penalties_and_bias_match_a_dense_reference(rep, pres, freq, bias):
    row = rows(1, seed=11)[0]
    generated = np.random.default_rng(2).integers(0, 40, size=64).tolist() + [3, 3, 17]
    params = SamplingParams(temperature=1.0, repetition_penalty=rep, presence_penalty=pres,
                            frequency_penalty=freq, logit_bias=bias)
    got = row.copy()
    apply_logit_edits(got, params, generated)
    want = dense_edits(row, params, generated)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    untouched = np.ones(V, bool)
    untouched[generated] = False
    untouched[list(bias)] = False
    assert np.array_equal(got[untouched], row[untouched])  # sparse: nothing else written


def test_penalties_change_the_greedy_choice_and_bias_bans():
    row = np.zeros((1, V), np.float32)
    row[0, 10], row[0, 20] = 5.0, 4.0
    s = BatchSampler(V)
    pick = lambda p, gen=(): int(s.sample_rows(row.copy(), [RowContext(p, np.random.default_rng(0), gen)])[0])  # noqa: E731
    assert pick(SamplingParams()) == 10
    assert pick(SamplingParams(repetition_penalty=1.5), [10]) == 20
    assert pick(SamplingParams(frequency_penalty=0.6), [10, 10]) == 20
    assert pick(SamplingParams(presence_penalty=0.6), [10, 10]) == 10  # 4.4 > 4
    assert pick(SamplingParams(logit_bias={10: -100})) == 20
    assert pick(SamplingParams(temperature=1.0, logit_bias={7: 100})) == 7
    with pytest.raises(ValueError, match="logit_bias"):
        pick(SamplingParams(logit_bias={V: 1.0}))


def test_read_only_logits_are_not_written():
    logits = rows(2, seed=5)
    before = logits.copy()
    logits.flags.writeable = False
    params = [SamplingParams(presence_penalty=2.0), SamplingParams(temperature=1.0, logit_bias={1: 3})]
    s = BatchSampler(V)
    s.sample_rows(logits, [RowContext(p, np.random.default_rng(0), [int(np.argmax(before[0]))]) for p in params])
    assert np.array_equal(logits, before)


class FakeMatcher:
    """A matcher with a fixed mask (the same array object every call)."""

    def __init__(self, mask):
        self.mask = mask
        self.seen_remaining = []

    def allowed_mask(self, remaining_tokens=None):
        self.seen_remaining.append(remaining_tokens)
        return self.mask

    def is_allowed(self, token, remaining_tokens=None):
        self.seen_remaining.append(remaining_tokens)
        return bool(self.mask[token])


def test_mixed_batch_equals_each_row_alone():
    g = np.random.default_rng(0)
    mask = g.random(V) < 0.3
    big_mask = g.random(V) < 0.95
    kinds = [
        (SamplingParams(), None, ()),
        (SamplingParams(repetition_penalty=1.3, presence_penalty=0.5), None, [1, 2, 2, 3]),
        (SamplingParams(temperature=0.8, top_k=20, top_p=0.9), None, ()),
        (SamplingParams(temperature=1.0), None, ()),
        (SamplingParams(temperature=1.2, top_p=0.8), None, ()),
        (SamplingParams(temperature=0.9, min_p=0.05), None, ()),
        (SamplingParams(temperature=1.0), mask, ()),
        (SamplingParams(temperature=0.7, top_k=30), mask, ()),
        (SamplingParams(temperature=1.0, top_p=0.9), big_mask, ()),
        (SamplingParams(), mask, [5, 5]),
        (SamplingParams(temperature=1.0, frequency_penalty=1.0, logit_bias={4: 3.0}), None, [4, 4, 9]),
    ]
    sampler = BatchSampler(V)
    for step in range(5):
        logits = rows(len(kinds), seed=100 + step)
        logits[:, :10] += 6.0
        ctx = lambda i, p, m, gen: RowContext(  # noqa: E731
            p, np.random.default_rng(step * 1000 + i), gen, None if m is None else FakeMatcher(m), 10)
        batch = sampler.sample_rows(logits.copy(), [ctx(i, *k) for i, k in enumerate(kinds)])
        for i, k in enumerate(kinds):
            alone = BatchSampler(V).sample_rows(logits[i : i + 1].copy(), [ctx(i, *k)])
            assert batch[i] == alone[0], (step, i)
            if k[1] is not None:
                assert k[1][batch[i]]
