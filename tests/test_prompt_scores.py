"""engine/prompt_scores.py without the model: which batch rows a step flags, where each output
lands in the block llama.cpp returns, and the log-softmax of the scored rows."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.prompt_scores import finished_scoring, map_outputs, record, scored_positions
from engine.step_plan import Chunk


def seq(tokens: list[int], n_prompt: int, scored: bool, max_tokens: int = 4, top: int = 2) -> SimpleNamespace:
    return SimpleNamespace(tokens=tokens, n_prompt=n_prompt, n_computed=0,
                           prompt_scores=[None] * n_prompt if scored else None,
                           request=SimpleNamespace(max_tokens=max_tokens, prompt_logprobs=top if scored else None))


def test_scored_rows_are_the_prompt_rows_but_the_last():
    s = seq(list(range(10)), 10, scored=True)
    assert scored_positions(Chunk(s, 0, 4)) == range(0, 4)
    assert scored_positions(Chunk(s, 4, 6)) == range(4, 9)  # row 9 predicts the first generated token
    assert scored_positions(Chunk(seq(list(range(10)), 10, scored=False), 0, 10)) == range(0)


def test_outputs_map_in_batch_row_order():
    decoding = seq([1, 2, 3], 2, scored=False)  # one decode row at batch row 0
    scored = seq(list(range(20, 30)), 10, scored=True)  # rows 1..6 hold its positions 4..9
    chunks = [(Chunk(decoding, 2, 1), 0), (Chunk(scored, 4, 6), 1)]
    flags = np.zeros(8, dtype=np.int8)
    flags[0] = 1  # the runner flags each sampling row itself
    flags[6] = 1
    layout = map_outputs(flags, 7, chunks)
    assert flags[:7].tolist() == [1, 1, 1, 1, 1, 1, 1]
    assert layout.sampling.tolist() == [0, 6]  # the decode row, then the scored prompt's last row
    (span,) = layout.spans
    assert (span.first_position, span.first_output, span.count) == (4, 1, 5)
    assert map_outputs(np.zeros(4, dtype=np.int8), 1, [(Chunk(decoding, 2, 1), 0)]) is None


def test_record_is_the_log_softmax_at_the_next_token():
    rng = np.random.default_rng(0)
    s = seq([3, 1, 4, 1, 5], 5, scored=True, top=2)
    chunk = Chunk(s, 0, 5)
    flags = np.zeros(5, dtype=np.int8)
    flags[4] = 1
    layout = map_outputs(flags, 5, [(chunk, 0)])
    logits = rng.normal(size=(5, 8)).astype(np.float32)
    record(logits, layout)
    assert s.prompt_scores[0] is None
    for p in range(1, 5):
        row = logits[p - 1].astype(np.float64)
        expected = row - np.log(np.exp(row).sum())
        entry = s.prompt_scores[p]
        assert entry.token == s.tokens[p] and abs(entry.logprob - expected[s.tokens[p]]) < 1e-12
        assert [t for t, _ in entry.top] == list(np.argsort(-expected)[:2])


def test_scoring_only_requests_finish_once_the_prompt_is_computed():
    only = seq([1, 2, 3], 3, scored=True, max_tokens=0)
    generating = seq([1, 2, 3], 3, scored=True, max_tokens=2)
    only.n_computed = generating.n_computed = 3
    assert finished_scoring([Chunk(only, 0, 3), Chunk(generating, 0, 3)]) == [only]
    assert not Chunk(only, 0, 3).wants_logits and Chunk(generating, 0, 3).wants_logits


def test_the_scored_rows_per_step_keep_the_output_buffer_within_its_bound():
    from engine.prompt_scores import max_scored_rows

    assert max_scored_rows(262_144) == 64  # Gemma 3's vocabulary: 67 MB of float32 logits
    assert max_scored_rows(32_000) == 524 and max_scored_rows(10**9) == 1


def test_a_scored_prompt_is_read_in_chunks_of_bounded_output_rows(monkeypatch):
    from engine import prompt_scores
    from tests.fake_backend import N_VOCAB, fake_engine

    monkeypatch.setattr(prompt_scores, "SCORED_OUTPUT_BYTES", 48 * N_VOCAB * 4)  # 48 rows of the fake vocabulary
    engine, runner = fake_engine(step_token_budget=256, n_ctx=2048)
    try:
        scored = [3 + i % 50 for i in range(300)]
        engine.submit(scored, max_tokens=1, prompt_logprobs=0, request_id="scored").result(10)
        engine.submit([3 + i % 40 for i in range(300)], max_tokens=1, request_id="plain").result(10)
    finally:
        engine.close()
    lengths = {rid: [r.length for step in runner.decoded for r in step if r.request_id == rid]
               for rid in ("scored", "plain")}
    assert sum(lengths["scored"]) == 300 and max(lengths["scored"]) == 48
    assert max(lengths["plain"]) == 256  # only scored prompts pay for the bound
