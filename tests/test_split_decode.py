"""A step that mixes decode rows with a prompt chunk, at flash attention's tile size or more, is
decoded as several llama_decode calls (engine/runner.py): each part's logits are those of a step
of its own, and the step is all or nothing."""
from types import SimpleNamespace

import numpy as np
import pytest

from bindings import FLASH_ATTN_TILE_ROWS, DecodeOutcome, Model
from engine.config import EngineConfig
from engine.request import Request
from engine.runner import ModelRunner, decode_calls
from engine.sequence import Sequence
from engine.step_plan import Chunk, StepPlan


def _chunk(decoding: bool, n_rows: int) -> Chunk:
    return Chunk(seq=SimpleNamespace(is_decoding=decoding), start=0, length=n_rows)


def _placed(chunks: list[Chunk]) -> list[tuple[Chunk, int]]:
    rows, placed = 0, []
    for c in chunks:
        placed.append((c, rows))
        rows += c.n_rows
    return placed


def test_decode_rows_and_prompt_chunks_go_apart_only_together_and_at_the_tile():
    tile = FLASH_ATTN_TILE_ROWS
    decode = [_chunk(True, 1) for _ in range(16)]
    prompt = _chunk(False, 100)
    calls = decode_calls(_placed([*decode, prompt]), 116)
    assert [(a, b) for a, b, _ in calls] == [(0, 16), (16, 116)] and calls[1][2] == [prompt]
    assert calls[0][2] == decode
    # Below the tile everything is one call: each row skips the cells its mask hides.
    assert decode_calls(_placed([*decode, _chunk(False, tile - 17)]), tile - 1) == []
    # Decoding rows alone (drafted runs) and prompt chunks alone stay one call.
    assert decode_calls(_placed([_chunk(True, 5) for _ in range(16)]), 80) == []
    assert decode_calls(_placed([_chunk(False, 100), _chunk(False, 100)]), 200) == []


@pytest.mark.model
def test_rows_decoded_apart_give_their_own_steps_logits_and_a_failed_call_undoes_the_others(model_path):
    with Model(model_path) as model:
        runner = ModelRunner(model, EngineConfig(n_ctx=4096, flash_attn=True, prefix_cache=False))
        try:
            rng = np.random.default_rng(7)

            def sequence(n_prompt: int, seq_id: int) -> Sequence:
                ids = [int(t) for t in rng.integers(1_000, 20_000, n_prompt)]
                seq = Sequence(Request(prompt=ids, max_tokens=8), ids, None, model.token_bytes, rng)
                seq.seq_id = seq_id
                return seq

            decoding = [sequence(40, i) for i in range(16)]
            for seq in decoding:  # prefill each, then give it a sampled token to decode
                runner.build_batch(StepPlan([Chunk(seq, 0, 40)]))
                assert runner.decode() is DecodeOutcome.OK
                seq.n_computed = 40
                seq.tokens.append(int(rng.integers(1_000, 20_000)))
            arriving = sequence(100, 16)
            plan = StepPlan([*(Chunk(s, 40, 1) for s in decoding), Chunk(arriving, 0, 100)])
            rows = runner.build_batch(plan)
            assert runner.decode_calls == 2 and rows == [*decoding, arriving]

            # The prompt chunk's call fails: the decode rows' cells are taken out again.
            real = runner.context.decode
            runner.context.decode = lambda batch, start=0, stop=None: (
                DecodeOutcome.KV_FULL if start > 0 else real(batch, start, stop))
            assert runner.decode() is DecodeOutcome.KV_FULL
            runner.context.decode = real
            assert [runner.context.seq_pos_max(s.seq_id) for s in decoding] == [39] * 16
            assert runner.context.seq_pos_max(arriving.seq_id) == -1

            assert runner.decode() is DecodeOutcome.OK
            apart = np.array(runner.output_logits())
            assert apart.shape == (17, model.n_vocab)
            # Each part gives what it gives in a step of its own: the decode rows what a decode
            # step gives them, the prompt chunk what it gives alone.
            for seq in [*decoding, arriving]:
                runner.context.seq_rm(seq.seq_id, 40 if seq is not arriving else 0, -1)
            for part, expected in (([Chunk(s, 40, 1) for s in decoding], apart[:16]),
                                   ([Chunk(arriving, 0, 100)], apart[16:])):
                runner.build_batch(StepPlan(part))
                assert runner.decode_calls == 1 and runner.decode() is DecodeOutcome.OK
                np.testing.assert_allclose(runner.output_logits(), expected, rtol=0, atol=1e-4)
        finally:
            runner.close()
