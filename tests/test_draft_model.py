"""A draft model (`--draft-model`): the default model drafting for itself, so that under greedy
decoding its drafts are what the model computes (acceptance near 1, outputs those without
drafts but at a near-tie); its context leaks no cells; a vocabulary that differs is refused."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from bindings import Model
from engine import Engine, EngineConfig
from engine.draft_model import DraftModel, DraftModelError, check_vocabulary, vocabulary_mismatch
from engine.drafts import DRAFT_MODEL, Drafter
from tests.test_speculation_model import NEAR_TIE_NATS

# Prompts the model-free sources have little for, so the draft model drafts most of them.
PROMPTS = ["Once upon a time", "The three primary colors are", "Write a haiku about the sea.\n"]


# ---- the vocabulary check --------------------------------------------------------------------
def test_the_same_vocabulary_passes_and_a_different_one_is_named():
    assert vocabulary_mismatch((b"a", b"b", b"c"), (b"a", b"b", b"c")) is None
    assert vocabulary_mismatch((b"a", b"b", b"c"), (b"a", b"b")) == "it has 2 tokens, the model 3"
    assert vocabulary_mismatch((b"a", b"b", b"c"), (b"a", b"x", b"c")) == "token 1 is b'x' there and b'b' in the model"


def _vocab(path: str, pieces: tuple[bytes, ...], eog: frozenset[int] = frozenset({2})) -> SimpleNamespace:
    return SimpleNamespace(path=path, token_bytes=pieces, eog_tokens=eog, special_tokens=eog)


def test_a_draft_model_with_another_vocabulary_is_refused_naming_both_files():
    main = _vocab("/m/main.gguf", (b"<s>", b"hello", b""))
    with pytest.raises(DraftModelError, match=r"draft model /m/other.gguf does not share the vocabulary of "
                                              r"/m/main.gguf: token 1 is b'hullo'"):
        check_vocabulary(main, _vocab("/m/other.gguf", (b"<s>", b"hullo", b"")))
    with pytest.raises(DraftModelError, match="special or end-of-generation tokens differ"):
        check_vocabulary(main, _vocab("/m/other.gguf", (b"<s>", b"hello", b""), eog=frozenset({0})))
    check_vocabulary(main, _vocab("/m/same.gguf", (b"<s>", b"hello", b"")))


def test_a_draft_model_needs_speculative_decoding():
    with pytest.raises(ValueError, match=r"draft_model needs speculative auto \(it is off\)"):
        EngineConfig(draft_model="/m/draft.gguf", speculative=False)


# ---- on the real model -----------------------------------------------------------------------
@pytest.mark.model
def test_the_model_shares_its_own_vocabulary(model_path):
    with Model(model_path) as a, Model(model_path) as b:
        check_vocabulary(a, b)


@pytest.mark.model
def test_a_missing_draft_model_fails_the_engine_with_its_path(model_path, tmp_path):
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        Engine(model_path, n_ctx=512, max_running=2, draft_model=str(missing))


@pytest.fixture(scope="module")
def runs(model_path):
    """Each prompt alone (one stream, where drafts pay), greedy: without drafts (with the top two
    alternatives, to judge a differing choice), and with the model drafting for itself. The
    model-free sources are switched off there: the small model soon repeats itself, and then
    they would propose nearly every draft, leaving the draft model few to make."""
    results = {}
    for draft in (None, str(model_path)):
        options = {"logprobs": 2} if draft is None else {}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Drafter, "propose", lambda self, *args: None)
            with Engine(model_path, n_ctx=2048, max_running=4, prefix_cache=False, speculative=draft is not None,
                        draft_model=draft) as engine:
                results[draft is not None] = [engine.generate([p], max_tokens=40, temperature=0.0, **options)[0]
                                              for p in PROMPTS]
                if draft is not None:
                    results["stats"] = engine.inspect(lambda runner: engine.core.speculator.stats())
                    results["leftover"] = engine.inspect(
                        lambda runner: (engine.draft_model.sequences, engine.draft_model.cells_held()))
                    results["kv"] = engine.kv_cells_in_use()
                    results["profile"] = engine.profile()
    return results


@pytest.mark.model
def test_greedy_outputs_are_the_same_with_a_draft_model_but_at_a_near_tie(runs):
    same = 0
    for off, on in zip(runs[False], runs[True]):
        first = next((i for i, (a, b) in enumerate(zip(off.token_ids, on.token_ids)) if a != b), None)
        if first is None:
            assert on.token_ids == off.token_ids and on.finish_reason == off.finish_reason
            same += 1
            continue
        (_, best), (_, second) = off.logprobs[first].top[:2]
        assert best - second < NEAR_TIE_NATS, f"token {first} differs with a gap of {best - second:.3f} nats"
    assert same >= len(PROMPTS) - 1


@pytest.mark.model
def test_the_model_drafting_for_itself_is_nearly_always_right(runs):
    stats = runs["stats"]
    drafted, accepted = stats.drafted[DRAFT_MODEL], stats.accepted[DRAFT_MODEL]
    assert sum(stats.drafted.values()) == drafted  # the model-free sources were off
    # Its own drafts differ from the model's tokens only where a batch's shape flips a near-tie.
    assert drafted >= 20 and accepted >= 0.9 * drafted, (drafted, accepted)
    assert sum(r.metrics.drafted_tokens for r in runs[True]) == sum(stats.drafted.values())
    assert runs["profile"]["decode"].seconds["draft_model"] > 0


@pytest.mark.model
def test_finished_requests_leave_no_cells_in_either_context(runs):
    assert runs["leftover"] == (0, 0)
    assert runs["kv"] == 0


class _Seq:
    """What the draft model reads of a sequence: its tokens (it keys its slots by identity)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens


@pytest.mark.model
def test_drafts_continue_from_kept_cells_and_slots_go_to_the_latest(model_path):
    with Model(model_path) as model:
        prompt = model.tokenize("The capital of France is")
        with Engine(model_path, n_ctx=512, max_running=2, speculative=False, prefix_cache=False) as engine:
            reference = list(engine.generate([prompt], max_tokens=6, temperature=0.0)[0].token_ids)
        # p_min 0: every draft runs to its limit, whatever the small model's confidence.
        draft = DraftModel(Model(model_path), n_ctx=256, n_slots=2, n_threads=2, flash_attn=False, p_min=0.0)
        try:
            a = _Seq(list(prompt))
            first = draft.propose({a: 3})[a]
            assert len(first) == 3 and first[0] == reference[0]
            decodes = draft.decodes
            # The model kept one drafted token and sampled another: the draft context keeps the
            # kept token's cell and feeds only the new one (one decode), then drafts from there.
            a.tokens += [first[0], 12345]
            draft.propose({a: 1})
            assert draft.decodes == decodes + 1
            assert draft.cells_held() == len(a.tokens)
            # A third sequence takes the slot of the one that drafted longest ago.
            b, c = _Seq(model.tokenize("Hello")), _Seq(model.tokenize("Goodbye"))
            draft.propose({b: 1})
            draft.propose({c: 1})
            assert draft.sequences == 2 and draft.cells_held() == len(b.tokens) + len(c.tokens)
            draft.release(b)
            draft.release(c)
            draft.release(a)  # already gone: nothing to free
            assert draft.sequences == 0 and draft.cells_held() == 0
        finally:
            draft.close()


@pytest.mark.model
def test_a_full_draft_context_gives_up_older_sequences_first(model_path):
    with Model(model_path) as model:
        long, longer = model.tokenize("word " * 180), model.tokenize("word " * 300)
    draft = DraftModel(Model(model_path), n_ctx=256, n_slots=2, n_threads=2, flash_attn=False, p_min=0.0)
    try:
        a, b = _Seq(list(long)), _Seq(list(long[:-1]))
        assert draft.propose({a: 2})
        assert draft.propose({b: 2})  # 2 x 180 tokens do not fit 256 cells: a gives its cells up
        assert draft.sequences == 1 and draft.cells_held() <= 256
        too_long = _Seq(longer)
        assert draft.propose({too_long: 2}) == {}  # alone it does not fit: no draft, and b keeps its cells
        assert draft.sequences == 1 and draft.cells_held() == len(b.tokens) + 1
        draft.release(b)
        assert draft.sequences == 0 and draft.cells_held() == 0
    finally:
        draft.close()
