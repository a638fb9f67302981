"""Speculative decoding without a model: draft sources, the rule that allots draft rows, the
verification's output distribution, and the engine loop with drafts over the fake backend
(outputs exactly those without drafts, KV invariants checked after every step in debug mode)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import math

from engine import FinishReason, Priority, Request
from engine.acceptance import AcceptanceRates
from engine.drafts import PROMPT_LOOKUP, RECENT_OUTPUTS, Draft, Drafter, NgramIndex, RecentOutputs, match_length
from engine.draft_payoff import DraftPayoff
from engine.speculation import Speculator
from engine.tuning import (
    DRAFT_CAP_MIN, DRAFT_CAP_START, DRAFT_GAIN_MARGIN, DRAFT_TARGET_MARGIN, MATCH_BUCKETS, PAYOFF_MIN_STEPS, PAYOFF_RETRY_STEPS,
)
from engine.step_cost import StepCost, StepCostModel
from engine.verify import verify
from sampling.params import SamplingParams
from sampling.sampler import BatchSampler
from tests.fake_backend import N_VOCAB, FakeCore, expected_tokens, fake_engine

# A small model on a CPU: the step's fixed cost (the weights' pass) dwarfs one more row's.
FIXED_HEAVY = StepCost(fixed_s=0.030, per_token_s=0.0005, per_output_s=0.0015)
# A batch that is compute-bound: rows are what a step costs.
ROW_HEAVY = StepCost(fixed_s=0.002, per_token_s=0.004, per_output_s=0.004)
# One stream whose first draft row turns the output projection into a matrix product.
JUMPY = StepCost(fixed_s=0.012, per_token_s=0.0005, per_output_s=0.0045, multi_output_s=0.018)


class _Seq:
    """What the allotment reads of a sequence."""

    def __init__(self, priority: Priority = Priority.BATCH, acceptance: float = 0.8) -> None:
        self.request = Request([1], priority=priority)
        self.acceptance = acceptance  # each drafted token's chance, given those before it were kept
        self.draft_cap = DRAFT_CAP_START


# ---- draft sources ---------------------------------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_longest_earlier_match():
    tokens = [5, 6, 7, 8, 9, 1, 2, 6, 7, 3, 4, 6, 7]
    index = NgramIndex(n_min=2, n_max=4)
    assert index.continuation(tokens, 3) == ((3, 4, 6), 2)  # (6, 7) last seen at 7-8, followed by 3
    tokens += [8]
    assert index.continuation(tokens, 2) == ((9, 1), 3)  # (6, 7, 8) is a longer match, from the start
    assert index.continuation([1, 2, 3], 4) == ((), 0)  # nothing repeats


def test_prompt_lookup_copies_the_occurrence_whose_match_runs_back_furthest():
    # "6 7" occurs twice before the end; the first occurrence's context (1 6 7) is the end's.
    tokens = [1, 6, 7, 2, 3, 9, 6, 7, 4, 5, 8, 1, 6, 7]
    assert NgramIndex(n_min=2, n_max=2).continuation(tokens, 2) == ((2, 3), 3)
    assert match_length(tokens, 3, tokens) == 3 and match_length(tokens, 8, tokens) == 2
    assert match_length(tokens, 3, tokens, cap=1) == 1


def test_a_loop_is_drafted_past_the_end_of_its_last_period():
    # Text repeating with period 3: the copy runs on into itself.
    assert NgramIndex().continuation([1, 2, 3, 1, 2, 3, 1, 2], 7) == ((3, 1, 2, 3, 1, 2, 3), 5)
    assert NgramIndex().continuation([4, 4, 4, 4], 3) == ((4, 4, 4), 3)


def test_recent_outputs_keep_scopes_apart_and_forget_the_oldest():
    recent = RecentOutputs(n_min=3, n_max=3, capacity=3)
    recent.add("alice", [1, 2, 3, 4, 5])
    assert recent.continuation("alice", [9, 1, 2, 3], 2) == ((4, 5), 3)
    assert recent.continuation("bob", [9, 1, 2, 3], 2) == ((), 0)
    recent.add("alice", [7, 8, 9, 10, 11])
    assert len(recent) == 3 and recent.continuation("alice", [1, 2, 3], 2) == ((), 0)  # evicted
    drafter = Drafter(recent)
    own = drafter.propose(NgramIndex(), [7, 8, 9, 5, 7, 8, 9], "alice", 2)
    assert own == Draft((5, 7), PROMPT_LOOKUP, 3)
    assert drafter.propose(NgramIndex(), [0, 7, 8, 9], "alice", 2) == Draft((10, 11), RECENT_OUTPUTS, 3)


# ---- acceptance by match length --------------------------------------------------------------
def test_acceptance_is_learned_per_match_length_so_a_copy_earns_long_drafts_and_chance_none():
    rates = AcceptanceRates(priors=(0.8,) * len(MATCH_BUCKETS), weight=0.2)
    for _ in range(30):
        rates.learn(Draft((1, 2, 3), PROMPT_LOOKUP, 2), kept=0)  # two-token matches miss at once
        rates.learn(Draft(tuple(range(32)), PROMPT_LOOKUP, 16), kept=32)  # copies are kept whole
    chance, copy = rates.gains(Draft((1,) * 8, PROMPT_LOOKUP, 2), 8), rates.gains(Draft((1,) * 32, PROMPT_LOOKUP, 16), 32)
    assert chance[0] < 0.05 and copy[-1] > 0.9
    assert all(a >= b for a, b in zip(copy, copy[1:]))  # a token counts only if all before it were kept
    assert Speculator.allot({_Seq(): chance}, JUMPY, 1, 1, 1.0) == {}
    assert list(Speculator.allot({(seq := _Seq()): copy}, JUMPY, 1, 1, 1.0).values()) == [32]
    assert len(rates.gains(Draft((1,) * 5, RECENT_OUTPUTS, 9), 32)) == 5  # no more rows than tokens
    # A kept token extends the match: a draft from a 3-token match that is kept for 2 tokens
    # teaches buckets 3 and 4 a success and bucket 4 (the 5-token match's) a failure.
    rates = AcceptanceRates(priors=(0.5,) * len(MATCH_BUCKETS), weight=1.0)
    rates.learn(Draft((1, 2, 3, 4), PROMPT_LOOKUP, 3), kept=2)
    table = dict(zip(MATCH_BUCKETS, rates.rates[PROMPT_LOOKUP]))
    assert (table[2], table[3], table[4], table[6]) == (0.5, 1.0, 0.0, 0.5)



# ---- the allotment ---------------------------------------------------------------------------
def _allot(seqs, cost, offered=8, **kw):
    gains = {s: [s.acceptance ** (i + 1) for i in range(offered)] for s in seqs}
    return Speculator.allot(gains, cost, tokens=len(seqs), outputs=len(seqs), expected_tokens=float(len(seqs)), **kw)


def test_drafts_pay_at_one_stream_and_not_in_a_compute_bound_batch():
    alone = _Seq(acceptance=0.9)
    assert _allot([alone], FIXED_HEAVY)[alone] == 8
    crowd = [_Seq(acceptance=0.9) for _ in range(16)]
    assert _allot(crowd, ROW_HEAVY) == {}
    assert _allot([_Seq(acceptance=0.02)], FIXED_HEAVY) == {}  # a sequence whose drafts miss gets none


def test_the_allotment_follows_the_break_even_rule_with_its_margin():
    # One more row is worth its gain g when g > m x c x E / T (m: DRAFT_GAIN_MARGIN; T counts
    # the rows already added at m times their cost).
    seq = _Seq(acceptance=0.5)
    granted = _allot([seq], FIXED_HEAVY)[seq]
    row_s = FIXED_HEAVY.per_token_s + FIXED_HEAVY.per_output_s
    m = DRAFT_GAIN_MARGIN
    tokens, seconds = 1.0 + sum(0.5 ** i for i in range(1, granted + 1)), FIXED_HEAVY.seconds(1, 1) + m * granted * row_s
    assert 0.5 ** granted * (seconds - m * row_s) > m * row_s * (tokens - 0.5 ** granted)  # the last row paid
    assert not 0.5 ** (granted + 1) * seconds > m * row_s * tokens  # the next would not have


def test_at_one_stream_the_jump_to_a_matrix_product_is_paid_only_by_a_run_of_likely_rows():
    # One stream's first draft row turns the output projection into a matrix product, which
    # costs most of a step; the rows after it cost little.
    jumpy = JUMPY
    likely, doubtful = _Seq(acceptance=0.9), _Seq(acceptance=0.6)
    assert _allot([likely], jumpy)[likely] >= 6  # one row would not pay its jump; a run does
    assert _allot([doubtful], jumpy) == {}  # at 0.6 no run pays it back
    assert _allot([doubtful], jumpy._replace(multi_output_s=0.0))[doubtful] >= 1  # without the jump it would draft
    two = [_Seq(acceptance=0.6), _Seq(acceptance=0.6)]  # two streams have paid the jump already
    assert _allot(two, jumpy)


def _ends_in_a_block(outputs: int, granted: dict, forced: dict | None = None, block: int = 4) -> bool:
    """The granted rows with logits fill the block the step's own output rows began, or end on a
    multiple of the block: never a block begun and left short."""
    forced = forced or {}
    logit_rows = sum(k - sum(forced.get(seq, ())[:k]) for seq, k in granted.items())
    end = outputs + logit_rows
    return end % block == 0 or end <= -(-outputs // block) * block


def test_on_repacked_weights_draft_rows_fill_blocks_of_four_output_rows():
    # Sixteen streams: a block of four output rows costs about what one row alone does, so one or
    # two drafts get nothing, and drafts come four rows at a time.
    cost = StepCost(fixed_s=0.040, per_token_s=0.0005, per_output_s=0.0015)
    crowd = [_Seq(acceptance=0.95) for _ in range(16)]
    gains = {seq: [0.95, 0.9] if i < 3 else [] for i, seq in enumerate(crowd)}
    step = dict(cost=cost, tokens=16, outputs=16, expected_tokens=16.0)
    linear = Speculator.allot(gains, **step)
    assert sum(linear.values()) == 6  # rows cost alike: every likely row is granted
    blocked = Speculator.allot(gains, **step, row_block=4)
    assert sum(blocked.values()) == 4 and _ends_in_a_block(16, blocked)
    assert Speculator.allot({crowd[0]: [0.95]}, **step, row_block=4) == {}  # one row would begin a block alone
    # Fifteen streams and a prompt's last row: the block they began takes one draft row.
    assert Speculator.allot({crowd[0]: [0.95]}, **step, row_block=4, output_rows=15) == {crowd[0]: 1}
    # There its projection is computed anyway: it costs a row without logits, and pays where a
    # row of a block of its own would not.
    row_heavy = dict(step, cost=StepCost(fixed_s=0.010, per_token_s=0.0015, per_output_s=0.0025))
    likely = {seq: [0.9, 0.85, 0.8, 0.75] for seq in crowd[:2]}
    assert Speculator.allot(likely, **row_heavy, row_block=4) == {}
    filled = Speculator.allot(likely, **row_heavy, row_block=4, output_rows=13)
    assert sum(filled.values()) == 3 and _ends_in_a_block(13, filled)
    # One stream's single row begins a block: one to three rows fill it, more go by fours.
    alone = _Seq(acceptance=0.9)
    granted = _allot([alone], FIXED_HEAVY, offered=9, row_block=4)[alone]
    assert granted in (3, 7)
    assert _allot([alone], FIXED_HEAVY, offered=2, row_block=4)[alone] == 2


def test_a_forced_drafted_token_needs_no_output_row_and_is_worth_no_token_itself():
    cost = StepCost(fixed_s=0.040, per_token_s=0.0005, per_output_s=0.0015)
    seq = _Seq(acceptance=0.95)
    gains = {seq: [0.95, 0.95, 0.95, 0.9, 0.85, 0.8]}
    step = dict(cost=cost, tokens=16, outputs=16, expected_tokens=16.0, row_block=4)
    assert Speculator.allot(gains, **step) == {seq: 4}  # four rows with logits fill a block
    # Two of the six tokens forced by the grammar: six tokens take the block's four rows.
    marks = (False, True, True, False, False, False)
    granted = Speculator.allot(gains, **step, forced_drafts={seq: marks})
    assert granted == {seq: 6} and _ends_in_a_block(16, granted, {seq: marks})
    # Forced tokens spare no sampling row: a draft whose rows with logits cannot pay is not
    # carried by forced tokens after them, however likely.
    row_heavy = StepCost(fixed_s=0.010, per_token_s=0.0015, per_output_s=0.0025)
    run, marks = {seq: [0.95] * 12}, (False, True, True) * 4  # 4 rows with logits, 8 forced tokens
    assert Speculator.allot(run, **{**step, "cost": row_heavy}, forced_drafts={seq: marks}) == {}


@settings(max_examples=200, deadline=None)
@given(outputs=st.integers(1, 20), data=st.data())
def test_granted_draft_rows_never_leave_a_block_begun_and_short(outputs, data):
    cost = StepCost(fixed_s=data.draw(st.floats(0.001, 0.05)), per_token_s=0.0005,
                    per_output_s=data.draw(st.floats(0.0001, 0.004)),
                    multi_output_s=data.draw(st.sampled_from([0.0, 0.01])))
    seqs = [_Seq() for _ in range(data.draw(st.integers(1, 4)))]
    gains, forced = {}, {}
    for seq in seqs:
        rates = data.draw(st.lists(st.floats(0.3, 1.0), min_size=1, max_size=9))
        gains[seq] = list(np.cumprod(rates))
        forced[seq] = (False, *data.draw(st.lists(st.booleans(), min_size=len(rates) - 1, max_size=len(rates) - 1)))
    granted = Speculator.allot(gains, cost, outputs, outputs, float(outputs), forced_drafts=forced, row_block=4,
                               room=data.draw(st.integers(1, 40)))
    assert _ends_in_a_block(outputs, granted, forced)
    assert all(0 < k <= len(gains[seq]) for seq, k in granted.items())


def test_a_batch_where_rows_cost_nearly_a_token_drafts_nothing_even_at_high_acceptance():
    # 16 streams, a row ~0.9 of the step's time per token (as measured at C=16 with Gemma 3's
    # vocabulary): even a 0.95 rate is within the margin, so no draft is verified.
    row_heavy = StepCost(fixed_s=0.02, per_token_s=0.004, per_output_s=0.011)
    crowd = [_Seq(acceptance=0.95) for _ in range(16)]
    assert _allot(crowd, row_heavy) == {}
    assert _allot(crowd[:1], row_heavy)[crowd[0]] >= 2  # the same sequence alone drafts


def test_a_step_where_no_draft_can_pay_looks_for_none():
    from engine.speculation import _a_certain_draft_pays

    row_heavy = StepCost(fixed_s=0.02, per_token_s=0.004, per_output_s=0.011)
    assert not _a_certain_draft_pays(row_heavy, 16, 8)  # 16 streams: even certain drafts lose
    assert _a_certain_draft_pays(row_heavy, 1, 8)
    crowd = [_Seq(acceptance=1.0) for _ in range(16)]
    assert _allot(crowd, row_heavy) == {}  # the allotment agrees: nothing is skipped that would pay
    assert _allot(crowd[:1], row_heavy)
    # On repacked weights, rows that fill a block of output rows the step began cost rows without
    # logits: those can pay where the step has them.
    repacked, plain = Speculator(max_draft=31, row_block=4), Speculator(max_draft=31)
    price = row_heavy.per_token_s + row_heavy.per_output_s
    assert not repacked.worth_looking(row_heavy, 16, 32, price, None, output_rows=16)
    assert repacked.worth_looking(row_heavy, 16, 32, price, None, output_rows=15)
    assert not plain.worth_looking(row_heavy, 16, 32, price, None, output_rows=15)


def test_a_fit_that_cannot_tell_fixed_from_row_costs_prices_rows_by_the_projections_share():
    from engine.speculation import _a_certain_draft_pays, projection_ratio

    # Gemma 3 270M's sizes; and a fit seen at 16 streams that put most of a step into its fixed
    # part (every step had 16 rows): rows at 5.6 ms, where a raw loop measured 9.2.
    ratio = projection_ratio(262_144, 640, 268_098_176)
    assert 1.6 < ratio < 1.75
    assert projection_ratio(262_144, 640, 0) == 0.0  # no weights known: no floor
    confused = StepCost(fixed_s=0.069, per_token_s=0.00336, per_output_s=0.00222)
    crowd = [_Seq(acceptance=0.95) for _ in range(16)]
    assert _allot(crowd, confused)  # priced as the fit says, certain-looking drafts are verified
    price = Speculator(8, projection_ratio=ratio).row_price(confused)
    assert price == pytest.approx((1 + ratio) * 0.00336)
    assert not _a_certain_draft_pays(confused, 16, 8, price)
    assert _allot(crowd, confused, row_s=price) == {}
    assert _allot(crowd[:1], confused, row_s=price)  # one stream still drafts
    assert Speculator(8).row_price(confused) == pytest.approx(0.00558)  # no ratio: the fit's own


def test_a_proposal_without_rows_is_judged_against_the_tokens_that_follow_and_counts_no_draft():
    spec = Speculator(8)
    spec.acceptance = AcceptanceRates(priors=(0.3,) * len(MATCH_BUCKETS), weight=0.2)
    seq = _Seq()
    seq.tokens = [5, 6]
    proposal = Draft((42, 43), PROMPT_LOOKUP, 8)

    def chance() -> float:
        return spec.acceptance.gains(proposal, 1)[0]

    for _ in range(3):  # its text starts repeating: each proposal matches what follows
        seq.unverified_draft = (proposal, len(seq.tokens))
        spec.sampled(seq, 42)
        assert seq.unverified_draft is not None  # right so far; its second token is not known yet
        seq.tokens.append(42)
        spec.sampled(seq, 43)
        seq.tokens.append(43)
        assert seq.unverified_draft is None
    assert chance() > 0.6
    # A draft whose first token is easy and whose second misses counts a success and a failure.
    before = list(spec.acceptance.rates[PROMPT_LOOKUP])
    seq.unverified_draft = (Draft((42, 43, 44), PROMPT_LOOKUP, 2), len(seq.tokens))
    spec.sampled(seq, 42)
    seq.tokens.append(42)
    spec.sampled(seq, 7)
    after = spec.acceptance.rates[PROMPT_LOOKUP]
    assert seq.unverified_draft is None and after[1] > before[1] and after[2] < before[2]  # buckets 2 and 3
    assert spec.stats().drafted[PROMPT_LOOKUP] == 0 and spec.stats().accepted[PROMPT_LOOKUP] == 0
    before = list(after)
    spec.sampled(seq, 7)  # nothing proposed: nothing learned
    assert spec.acceptance.rates[PROMPT_LOOKUP] == before


def test_a_sequence_s_draft_cap_doubles_on_a_draft_kept_whole_and_halves_on_a_miss():
    spec = Speculator(31)
    seq = _Seq()
    seq.tokens, seq.unverified_draft, seq.drafted_tokens, seq.accepted_tokens = [5, 6], None, 0, 0
    caps = []
    for _ in range(3):
        caps.append(seq.draft_cap)
        spec.verified(seq, Draft(tuple(range(seq.draft_cap)), PROMPT_LOOKUP, 40), seq.draft_cap)
    # A draft at its cap and its sampling row make a multiple of four output rows (engine/tuning.py).
    assert caps == [7, 15, 31] and seq.draft_cap == 31
    spec.verified(seq, Draft(tuple(range(31)), PROMPT_LOOKUP, 40), 31)
    assert seq.draft_cap == 31  # never past max_draft
    missed = []
    for _ in range(5):  # a copy that ended: confident drafts miss, and grow short
        missed.append(seq.draft_cap)
        spec.verified(seq, Draft(tuple(range(seq.draft_cap)), PROMPT_LOOKUP, 40), 1)
    assert missed == [31, 15, 7, 3, 3] and seq.draft_cap == DRAFT_CAP_MIN
    assert all((cap + 1) % 4 == 0 for cap in {*caps, *missed})
    # A proposal without rows, judged whole and found right, lets the next one grow as well.
    seq.unverified_draft = (Draft((42, 43, 44, 45), PROMPT_LOOKUP, 12), len(seq.tokens))
    for token in (42, 43, 44, 45):
        spec.sampled(seq, token)
        seq.tokens.append(token)
    assert seq.draft_cap == 2 * DRAFT_CAP_MIN + 1
    assert (seq.drafted_tokens, seq.accepted_tokens) == (7 + 15 + 31 + 31 + sum(missed), 7 + 15 + 31 + 31 + 5)


def test_interactive_sequences_draft_first_and_a_limit_or_no_room_stops_drafts():
    chat, job = _Seq(Priority.INTERACTIVE, acceptance=0.6), _Seq(acceptance=0.95)
    assert _allot([chat, job], FIXED_HEAVY, room=3) == {chat: 3}
    row_s = FIXED_HEAVY.per_token_s + FIXED_HEAVY.per_output_s
    limit = FIXED_HEAVY.seconds(2, 2) + 2.5 * row_s
    assert sum(_allot([chat, job], FIXED_HEAVY, limit_s=limit).values()) == 2
    assert _allot([chat], FIXED_HEAVY, room=0) == {}


# ---- verification's distribution -------------------------------------------------------------
ALPHA = 1e-3  # each chi-square test's false-alarm rate


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """P(a chi-square with len - 1 degrees of freedom exceeds the statistic), by the
    Wilson-Hilferty approximation (a few percent of alpha at these sizes)."""
    stat, k = float(((observed - expected) ** 2 / expected).sum()), len(observed) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _target(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), temperature=st.sampled_from([0.7, 1.0, 1.5]), drafted_rank=st.integers(0, 5))
def test_verification_keeps_the_models_distribution_at_the_first_drafted_position(seed, temperature, drafted_rank):
    # Over many runs, the token a sampled request gets where a draft stood (the draft itself,
    # or the model's own choice when it refused it) follows the model's distribution exactly.
    rng = np.random.default_rng(seed)
    vocab = 16
    row = rng.normal(0, 1.5, vocab).astype(np.float32)
    draft_token = int(np.argsort(-row)[drafted_rank])
    p = _target(row.astype(np.float64), temperature)
    sampler = BatchSampler(vocab)
    counts = np.zeros(vocab)
    runs = 2000
    engine_rng = np.random.default_rng(seed + 1)
    for _ in range(runs):
        seq = _verifiable(vocab, temperature, engine_rng)
        logits = np.stack([row, rng.normal(0, 1, vocab).astype(np.float32)])
        first = int(sampler.sample_rows(logits[:1].copy(), [_row(seq)])[0])
        verify(sampler, logits, seq, first, (draft_token,), frozenset(), 1024)
        counts[seq.tokens[seq.n_prompt]] += 1
    expected = p * runs
    keep = expected >= 5  # chi-square needs enough expected counts per cell
    observed, wanted = counts[keep], expected[keep]
    if (~keep).any():  # the rare tokens together, as one cell
        observed, wanted = np.append(observed, counts[~keep].sum()), np.append(wanted, expected[~keep].sum())
    assert chi_square_p(observed, wanted) > ALPHA


def _verifiable(vocab: int, temperature: float, rng: np.random.Generator):
    from engine.handle import RequestHandle
    from engine.sequence import Sequence

    request = Request([0], max_tokens=4, sampling=SamplingParams(temperature=temperature))
    return Sequence(request, [0], RequestHandle(request.request_id, 1, lambda _: None), (b"",) * vocab, rng)


def _row(seq):
    from sampling.sampler import RowContext

    return RowContext(seq.request.sampling, seq.rng)


# ---- the engine with drafts, over the fake backend -------------------------------------------
@pytest.fixture
def drafting(monkeypatch):
    monkeypatch.setattr(StepCostModel, "estimate", lambda self, threads=None: FIXED_HEAVY)
    # Fake steps take real, tiny and uneven seconds: what drafts made per second is not their test.
    monkeypatch.setattr(DraftPayoff, "holds_back", lambda self, decoding: False)
    engine, runner = fake_engine(speculative=True, max_running=4, step_token_budget=64)
    yield engine, runner
    engine.close()


def _repetitive(i: int) -> list[int]:
    return [0] + [2 + (i * 5 + k) % 9 for k in range(30)]


def test_greedy_outputs_are_exactly_those_without_drafts(drafting):
    engine, runner = drafting
    prompts = [_repetitive(i) for i in range(6)]
    results = engine.generate(prompts, max_tokens=40, temperature=0.0)
    for prompt, result in zip(prompts, results):
        assert list(result.token_ids) == expected_tokens(prompt, 40) and result.finish_reason is FinishReason.LENGTH
    engine.inspect(lambda runner: None)  # the turn that answered them has published its stats
    stats = engine.stats()
    assert stats.speculation.drafted[PROMPT_LOOKUP] > 0 and stats.speculation.accepted[PROMPT_LOOKUP] > 0
    assert any(row.drafted for step in runner.decoded for row in step)
    assert sum(r.metrics.accepted_tokens for r in results) == sum(stats.speculation.accepted.values())
    assert all(r.metrics.accepted_tokens <= r.metrics.drafted_tokens for r in results)
    assert stats.running == 0 and stats.kv.blocks_used == 0


def test_drafts_save_steps(drafting, monkeypatch):
    engine, runner = drafting
    prompt = _repetitive(3)
    engine.generate([prompt], max_tokens=60, temperature=0.0)
    with_drafts = len(runner.decoded)
    engine2, runner2 = fake_engine(speculative=False)
    try:
        engine2.generate([prompt], max_tokens=60, temperature=0.0)
    finally:
        engine2.close()
    assert with_drafts < len(runner2.decoded)


def test_max_tokens_and_stop_hold_with_drafts(drafting):
    engine, _ = drafting
    prompt = _repetitive(1)
    for n in (1, 2, 7, 13):
        result = engine.generate([prompt], max_tokens=n, temperature=0.0)[0]
        assert list(result.token_ids) == expected_tokens(prompt, n) and result.finish_reason is FinishReason.LENGTH
    text = engine.generate([prompt], max_tokens=40, temperature=0.0)[0].text
    stop = text[9:11]
    stopped = engine.generate([prompt], max_tokens=40, temperature=0.0, stop=[stop])[0]
    assert stopped.text == text[: text.index(stop)] and stopped.finish_reason is FinishReason.STOP


def test_a_request_may_opt_out(drafting):
    engine, runner = drafting
    result = engine.submit(Request(_repetitive(2), max_tokens=30, speculative=False,
                                   sampling=SamplingParams(temperature=0.0))).result(10)
    assert result.metrics.drafted_tokens == 0 and not any(row.drafted for step in runner.decoded for row in step)


def test_sampled_requests_keep_their_random_stream_with_drafts(monkeypatch):
    # One draw per token kept, drafts or not: the same seed gives the same tokens.
    monkeypatch.setattr(StepCostModel, "estimate", lambda self, threads=None: FIXED_HEAVY)
    outputs = []
    for speculative in (False, True):
        engine, _ = fake_engine(speculative=speculative)
        try:
            outputs.append(engine.generate([_repetitive(4)], max_tokens=40, temperature=0.9, seed=7)[0].token_ids)
        finally:
            engine.close()
    assert outputs[0] == outputs[1]


def test_finished_outputs_draft_for_later_requests_of_their_scope(drafting):
    engine, _ = drafting
    first = [0, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31]
    engine.submit(Request(first, max_tokens=30, draft_scope="job-1", sampling=SamplingParams(temperature=0.0))).result(10)
    again = engine.submit(Request(first, max_tokens=30, draft_scope="job-1",
                                  sampling=SamplingParams(temperature=0.0))).result(10)
    assert list(again.token_ids) == expected_tokens(first, 30)
    assert engine.stats().speculation.drafted[RECENT_OUTPUTS] > 0


def test_a_step_carrying_prompt_chunks_prices_draft_rows_as_the_decode_steps_to_come():
    # Three sequences decode while thirteen more fill their prompts in 250-token chunks: the
    # step makes three tokens in a long time, but a kept draft token spares a row of a decode
    # step of all sixteen, where rows cost nearly a token each.
    seqs = [_Seq(acceptance=0.8) for _ in range(3)]
    gains = {s: [0.8 ** (i + 1) for i in range(8)] for s in seqs}
    mixed = dict(cost=ROW_HEAVY, tokens=253, outputs=3, expected_tokens=3.0)
    assert Speculator.allot(gains, **mixed)  # judged by this step alone, every sequence drafts
    assert Speculator.allot(gains, **mixed, steady=16) == {}
    assert Speculator.allot(gains, **mixed, steady=3) == Speculator.allot(gains, **mixed)
    alone = {(seq := _Seq(acceptance=0.9)): [0.9 ** (i + 1) for i in range(8)]}
    assert Speculator.allot(alone, FIXED_HEAVY, 1, 1, 1.0, steady=1)[seq] == 8  # one stream: as before


def test_a_kept_draft_is_worth_a_sampling_row_not_the_forced_tokens_fed_in_its_step():
    # Sixteen structured answers, each feeding its sampled token and one forced by the grammar: a
    # kept draft spares a sampling row and its share of the step, while the forced rows are fed
    # either way. Priced with them in, a token looks dearer and drafts that lose look paying.
    cost = StepCost(fixed_s=0.010, per_token_s=0.002, per_output_s=0.002)
    gains = {_Seq(acceptance=0.9): [0.9] for _ in range(16)}
    step = dict(cost=cost, tokens=32, outputs=16, expected_tokens=16.0)
    assert len(Speculator.allot(gains, **step)) == 16  # as if forced rows were sampled ones
    assert Speculator.allot(gains, **step, forced=16) == {}
    assert Speculator.allot(gains, **step, forced=16) == Speculator.allot(gains, cost, 16, 16, 16.0)


# ---- the measured payoff ---------------------------------------------------------------------
def test_kept_drafted_tokens_the_grammar_forced_count_for_the_payoff_as_jump_forward_s():
    # They are jump-forward's tokens fed a step early: a drafted step is credited with neither
    # them nor their rows, as a plain step is not with the forced tokens it appends.
    from engine.step_plan import StepPlan
    cost = StepCost(fixed_s=0.010, per_token_s=0.002, per_output_s=0.003)
    spec = Speculator(max_draft=31)
    spec.draft(StepPlan(), None, cost, room=16, n_ctx=4096, limit_s=None, running=4)
    seq = _Seq()
    seq.unverified_draft, seq.drafted_tokens, seq.accepted_tokens = None, 0, 0
    spec.verified(seq, Draft((5, 6, 7, 8), PROMPT_LOOKUP, 4), 3, (False, True, True, False))
    spec.step_done(True, advanced=8, seconds=0.050)
    plain = spec.payoff.plain[4]
    assert plain.tokens.value == 8 - 2  # two forced tokens kept
    assert plain.seconds.value == pytest.approx(0.050 - 2 * cost.per_token_s)
    assert spec.forced_draft_tokens == 2 and spec.verified_rows == 4 + 1 - 2


def test_drafts_stop_where_drafted_steps_made_fewer_tokens_per_second_and_are_tried_again_later():
    payoff = DraftPayoff()
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.record(16, 16, 0.143)  # plain: 112 tok/s
        payoff.record(1, 1, 0.028)
        assert not payoff.loses(16)  # too few drafted steps to judge
        payoff.record(16, 19, 0.200, draft_rows=4)  # drafted: 3 more tokens, 95 tok/s
        payoff.record(1, 6, 0.060, draft_rows=8)  # one stream: 100 tok/s against 36
    assert payoff.loses(16) and not payoff.loses(1)
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.record(1, 1, 0.060, draft_rows=4)  # one stream losing: left to the prediction
    assert not payoff.loses(1)
    assert not payoff.loses(8)  # nothing known at another count
    for _ in range(PAYOFF_RETRY_STEPS - 1):
        payoff.record(16, 16, 0.143)
    assert payoff.loses(16)
    payoff.record(16, 16, 0.143)
    assert not payoff.loses(16)  # stale: drafts are tried there again
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.record(16, 24, 0.160, draft_rows=12)  # now they pay: 150 tok/s
    assert not payoff.loses(16)


def test_where_every_step_drafts_every_other_one_is_held_back_until_the_verdict():
    # Without plain steps at a count there is nothing to weigh drafted ones against: a batch in
    # which some sequence has a draft at every step would draft, losing or not, for good.
    def run(drafted_tokens: int) -> tuple[int, DraftPayoff]:
        payoff, held = DraftPayoff(), 0
        for _ in range(4 * PAYOFF_MIN_STEPS):
            if payoff.holds_back(16):
                held += 1
                payoff.record(16, 16, 0.143)  # plain: 112 tok/s
            else:
                payoff.record(16, drafted_tokens, 0.200, draft_rows=16)
        assert not payoff.holds_back(1) and not payoff.holds_back(8)
        return held, payoff

    held, payoff = run(19)  # drafted: 95 tok/s, losing
    assert payoff.loses(16)
    assert held >= PAYOFF_MIN_STEPS  # the plain steps the verdict needed, then every step since
    held, payoff = run(30)  # drafted: 150 tok/s, paying
    assert held == PAYOFF_MIN_STEPS and not payoff.loses(16) and not payoff.holds_back(16)


def test_drafted_steps_of_several_streams_set_a_floor_under_a_draft_row_s_price():
    # The story at 16 streams, in process: the fit priced a draft row at 3.9 ms and a plain step at
    # 75-80 ms; steps with 4 to 27 draft rows took 5.5-15 ms more per row. At the fit's price sure
    # drafts look worth verifying; at the measured one they do not, and one stream keeps the fit's.
    from engine.speculation import _a_certain_draft_pays

    fit = StepCost(fixed_s=0.020, per_token_s=0.0015, per_output_s=0.0024)
    spec = Speculator(16, projection_ratio=1.67)
    fitted = spec.row_price(fit, 16)
    assert fitted == pytest.approx(0.004005) and _a_certain_draft_pays(fit, 16, 16, fitted)
    plain_s = fit.seconds(16, 16)
    for rows, seconds in ((4, 0.134), (6, 0.119), (10, 0.137), (27, 0.224)):
        spec.payoff.record(16, 16 + rows, seconds, draft_rows=rows, undrafted_s=plain_s)
        spec.payoff.record(1, 9, 0.080, draft_rows=8, undrafted_s=0.028)  # one stream: not counted
    measured = spec.row_price(fit, 16)
    assert 0.006 < measured < 0.012 and spec.payoff.row_s == measured
    assert not _a_certain_draft_pays(fit, 16, 16, measured)
    assert _a_certain_draft_pays(fit, 2, 16, measured)  # two streams: a sure draft still pays
    assert spec.row_price(fit, 1) == fitted
    spec.payoff.record(16, 16, 0.075)  # plain steps say nothing of draft rows
    assert spec.row_price(fit, 16) == measured


def test_a_draft_row_s_price_is_measured_against_plain_steps_once_there_are_enough():
    # The fit says a plain 16-row step takes 110 ms where plain steps take 95: against the fit,
    # 10 draft rows adding 45 ms would look like 3.5 ms each instead of 4.5.
    payoff = DraftPayoff()
    payoff.record(16, 26, 0.140, draft_rows=10, undrafted_s=0.110)
    assert payoff.row_s == pytest.approx(0.003)  # no plain steps yet: the fit's price
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.record(16, 16, 0.095)
    payoff.record(16, 26, 0.140, draft_rows=10, undrafted_s=0.110)
    assert payoff.row_s == pytest.approx((0.003 + 0.0045) / 2)
    payoff.record(8, 12, 0.080, draft_rows=4, undrafted_s=0.060)  # no plain steps at 8
    assert payoff.row_s == pytest.approx((0.030 + 0.045 + 0.020) / (10 + 10 + 4))  # weighted by rows


def test_a_large_drafted_step_weighs_in_the_row_price_by_its_rows():
    # Paragraphs at 16 streams, in process: steps with 16-32 draft rows measured 4.5-5.5 ms a row,
    # then 240 rows took 6.1 ms each. A mean over steps priced the next at 5.0 ms and verified
    # 240 rows again; over rows, the large step's price is what the next large step is judged by.
    payoff = DraftPayoff()
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.record(16, 16, 0.090)
    for rows, seconds in ((32, 0.264), (17, 0.176), (16, 0.160), (240, 1.557)):
        payoff.record(16, 16 + rows, seconds, draft_rows=rows)
    extra = (0.174 + 0.086 + 0.070 + 1.467)
    per_step = (0.174 / 32 + 0.086 / 17 + 0.070 / 16 + 1.467 / 240) / 4
    assert payoff.row_s == pytest.approx(extra / (32 + 17 + 16 + 240))
    assert payoff.row_s > 0.090 / 16 > per_step  # over a plain step's time per token, and per step under it
    assert payoff.plain_step(16) == pytest.approx((16, 0.090)) and payoff.plain_step(8) is None


def test_drafts_are_weighed_against_plain_steps_as_measured_not_as_the_fit_prices_them():
    # The fit, fed every shape of step, put a plain 16-row step at 101 ms where plain steps took
    # 90: against 101 ms, a sure draft row at 5.0 ms looked worth its margin; against 90 it is not.
    from engine.speculation import _a_certain_draft_pays

    fit = StepCost(fixed_s=0.037, per_token_s=0.002, per_output_s=0.002)
    assert fit.seconds(16, 16) == pytest.approx(0.101)
    crowd = [_Seq(acceptance=0.999) for _ in range(16)]
    assert _a_certain_draft_pays(fit, 16, 16, 0.0050) and _allot(crowd, fit, row_s=0.0050, steady=16)
    measured = (16.0, 0.090)
    assert not _a_certain_draft_pays(fit, 16, 16, 0.0050, measured)
    assert _allot(crowd, fit, row_s=0.0050, steady=16, reference=measured) == {}
    assert _allot(crowd, fit, row_s=0.0030, steady=16, reference=measured)  # cheap rows still pay


def test_the_engine_looks_for_no_drafts_where_its_drafted_steps_lost(drafting, monkeypatch):
    engine, runner = drafting
    monkeypatch.undo()
    monkeypatch.setattr(StepCostModel, "estimate", lambda self, threads=None: FIXED_HEAVY)
    prompt = _repetitive(2)

    def lost_at_two_streams(runner):
        payoff = engine.core.speculator.payoff
        for _ in range(PAYOFF_MIN_STEPS):
            payoff.record(2, 2, 0.030)
            payoff.record(2, 3, 0.090, draft_rows=2)

    engine.inspect(lost_at_two_streams)
    results = engine.generate([prompt, _repetitive(4)], max_tokens=30, temperature=0.0)
    assert [list(r.token_ids) for r in results] == [expected_tokens(prompt, 30), expected_tokens(_repetitive(4), 30)]
    assert not any(row.drafted for step in runner.decoded for row in step)
    assert sum(r.metrics.drafted_tokens for r in results) == 0
    alone = engine.generate([_repetitive(5)], max_tokens=30, temperature=0.0)[0]
    assert alone.metrics.drafted_tokens > 0  # one stream: nothing measured there


def test_a_drafted_step_under_the_latency_target_is_judged_against_a_prediction_with_its_draft_rows(monkeypatch):
    # The calibration learns how far intervals run past predictions; a drafted step's prediction
    # must count its draft rows, or every drafted step would read as late and shrink later budgets.
    monkeypatch.setattr(StepCostModel, "estimate", lambda self, threads=None: FIXED_HEAVY)
    monkeypatch.setattr(DraftPayoff, "holds_back", lambda self, decoding: False)
    c = FakeCore(speculative=True, interactive_token_ms=55, batch_min_share=0.1)
    c.add("b0", _repetitive(7), 40)
    c.add("i0", _repetitive(2), 40, priority="interactive")
    policy = c.core.scheduler.policy
    for _ in range(40):
        c.core.step()
        rows = c.runner.current
        if policy._last_step_bounded and any(r.drafted for r in rows):
            break
    else:
        raise AssertionError("no drafted step under the latency target")
    n_rows = sum(r.length + r.drafted for r in rows)
    predicted = FIXED_HEAVY.seconds(n_rows, len(rows) + sum(r.drafted for r in rows))
    start = policy.calibration
    # Drafts stay a margin inside the target: its p95 is what the calibration aims whole steps at.
    assert predicted * start <= (1.0 - DRAFT_TARGET_MARGIN) * 0.055 + 1e-9
    policy.interactive_intervals([0.99 * predicted * start])  # on time for the step as drafted
    assert policy.calibration < start


def test_a_step_with_prompt_chunks_drafts_only_once_plain_steps_at_its_count_are_measured(monkeypatch):
    # Such a step is never weighed itself, so before plain steps are measured its drafts would go
    # on the fit's prices alone: a JSON job at 16 streams drafted in a burst there at its start
    # (18 of 37 drafted steps, at 108 tok/s against 129 for plain ones) and ran at 0.90 of off.
    monkeypatch.setattr(StepCostModel, "estimate", lambda self, threads=None: FIXED_HEAVY)
    monkeypatch.setattr(DraftPayoff, "holds_back", lambda self, decoding: False)

    def steps_with_prompt_chunks(measured: bool) -> tuple[int, int, int]:
        reference = (lambda self, n: (float(n), FIXED_HEAVY.seconds(n, n))) if measured else (lambda self, n: None)
        monkeypatch.setattr(DraftPayoff, "plain_step", reference)
        c = FakeCore(speculative=True, max_running=8)
        c.add("a", _repetitive(1), 60)
        with_chunks = drafted = drafted_plain = 0
        for step in range(24):
            if step % 3 == 1:
                c.add(f"b{step}", _repetitive(2 + step % 5)[:12], 2)
            c.core.step()
            rows = c.runner.current
            if any(r.request_id != "a" and r.start == 0 and r.length > 1 for r in rows):
                with_chunks += 1
                drafted += sum(r.drafted for r in rows)
            else:
                drafted_plain += sum(r.drafted for r in rows)
        return with_chunks, drafted, drafted_plain

    with_chunks, drafted, drafted_plain = steps_with_prompt_chunks(measured=False)
    assert with_chunks >= 5 and drafted == 0 and drafted_plain > 0  # decode-only steps are weighed: they draft
    with_chunks, drafted, _ = steps_with_prompt_chunks(measured=True)
    assert with_chunks >= 5 and drafted > 0


# ---- drafted tokens the grammar forces ------------------------------------------------------
def _one_hot(vocab: int, token: int) -> np.ndarray:
    row = np.zeros(vocab, dtype=np.float32)
    row[token] = 5.0
    return row


@pytest.mark.parametrize("row_after_forced, kept", [(7, 3), (9, 2)])
def test_a_forced_drafted_token_is_kept_without_a_row_and_the_rows_after_it_are_read_in_order(row_after_forced, kept):
    # Draft (4, 5, 7), the grammar forcing 5: the rows computed are the sampling row (it chose 4),
    # the row after 5 (which must choose 7 to keep it) and the row after 7; none after 4.
    vocab = 16
    seq = _verifiable(vocab, 0.0, np.random.default_rng(0))
    seq.matcher = None
    logits = np.stack([_one_hot(vocab, 4), _one_hot(vocab, row_after_forced), _one_hot(vocab, 11)])
    result = verify(BatchSampler(vocab), logits, seq, 4, (4, 5, 7), frozenset(), 1024, forced=(False, True, False))
    assert result.accepted == kept
    expected = [4, 5, 7, 11] if kept == 3 else [4, 5, row_after_forced]
    assert seq.tokens[seq.n_prompt:] == expected


def test_rows_without_logits_are_those_before_forced_tokens():
    from engine.prompt_scores import map_outputs
    from engine.step_plan import Chunk
    from types import SimpleNamespace

    s = SimpleNamespace(tokens=[1, 2, 3], n_prompt=2, prompt_scores=None,
                        request=SimpleNamespace(max_tokens=8, prompt_logprobs=None))
    chunk = Chunk(s, 2, 1, draft=(4, 5, 6, 7), forced=(False, True, True, False))
    assert chunk.logit_rows == [0, 3, 4]
    assert Chunk(s, 2, 1, draft=(4, 5)).logit_rows == [0, 1, 2]
    # With a scored prompt in the same step, the sampling outputs are found among all outputs.
    scored = SimpleNamespace(tokens=list(range(20, 26)), n_prompt=6, n_computed=0, prompt_scores=[None] * 6,
                             request=SimpleNamespace(max_tokens=4, prompt_logprobs=1))
    flags = np.zeros(16, dtype=np.int8)
    flags[[0, 3, 4]] = 1  # the runner flags the drafted chunk's rows with logits
    flags[10] = 1  # the scored prompt's last row
    layout = map_outputs(flags, 11, [(chunk, 0), (Chunk(scored, 0, 6), 5)])
    assert layout.sampling.tolist() == [0, 1, 2, 8]
