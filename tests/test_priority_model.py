"""Priority on the real model: with the batch tier filling every slot, an interactive request
gets its first token within a couple of engine steps (counted in steps, not milliseconds), and
the batch work it displaced resumes and finishes without the client seeing anything but time."""
from __future__ import annotations

import time

import pytest

from engine import Engine, FinishReason

pytestmark = pytest.mark.model

BATCH_TOKENS = 96


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# flash attention on is what `cobatch serve` runs with; off is the Engine's default. Without the
# first-token lane the scheduler serves the arrival within two steps; with it, no step passes.
@pytest.mark.parametrize("flash_attn,lane", [(False, 0), (True, 0), (True, 32)],
                         ids=["flash-attn-off", "flash-attn-on", "first-token-lane"])
def test_interactive_first_token_within_two_steps_under_a_batch_flood(model_path, flash_attn, lane):
    with Engine(model_path, n_ctx=2048, max_running=4, step_token_budget=64, prefix_cache=True,
                flash_attn=flash_attn, first_token_lane_tokens=lane) as engine:
        batch = engine.submit_many(
            [f"Write a long story about lighthouse keeper number {i}." for i in range(6)],
            max_tokens=BATCH_TOKENS, ignore_eos=True, temperature=0.7, seed=1234,
        )
        wait_until(lambda: engine.stats().running == 4 and all(len(h.streamed_text()) > 0 for h in batch[:4]))
        assert engine.stats().tiers["batch"].waiting == 2
        answers = []
        for k in range(3):
            handle = engine.submit("What is the capital of France?", max_tokens=8, priority="interactive")
            answers.append(handle.result(60))
            time.sleep(0.2)
        for result in answers:
            assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert result.metrics.first_token_from_lane is bool(lane)
            assert (result.metrics.ttft_steps == 0) if lane else (1 <= result.metrics.ttft_steps <= 2), result.metrics
        stats = engine.stats()
        assert stats.tiers["batch"].suspensions >= 1  # slots were full: batch made room
        assert stats.tiers["interactive"].finished == 3
        results = [h.result(300) for h in batch]
        for handle, result in zip(batch, results):
            assert result.finish_reason is FinishReason.LENGTH and len(result.token_ids) == BATCH_TOKENS
            assert result.error is None and handle.streamed_text() == result.text
        assert sum(r.metrics.suspensions for r in results) == stats.tiers["batch"].suspensions
        assert sum(r.metrics.preemptions for r in results) == stats.tiers["batch"].preemptions
        assert engine.stats().running == 0 and engine.stats().kv.blocks_used == 0
