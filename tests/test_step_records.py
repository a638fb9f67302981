"""The per-step records and per-tier token counters each stats snapshot carries (the web page's
engine view reads them): driven on the core directly over the fake backend."""
from __future__ import annotations

from engine import EngineConfig
from engine.core import EngineCore
from engine.intake import Intake
from engine.stats import RECENT_STEPS
from tests.fake_backend import FakeModel, FakeRunner


def make_core(**overrides):
    settings = dict(n_ctx=1024, max_running=4, step_token_budget=64, n_threads=1, prefix_cache=False,
                    speculative=False, first_token_lane_tokens=0)
    settings.update(overrides)
    config = EngineConfig(**settings)
    core = EngineCore(FakeModel(), FakeRunner(config.n_ctx), config)
    intake = Intake(FakeModel(), config.n_ctx, canceller=lambda request_id: None)

    def add(request_id: str, n_prompt: int, max_tokens: int, priority: str):
        tokens = [0] + [2 + k % 50 for k in range(n_prompt - 1)]
        core.add(intake.sequence(tokens, dict(max_tokens=max_tokens, request_id=request_id, priority=priority,
                                              temperature=0.0)))
    return core, add


def test_each_step_records_its_rows_prompt_tokens_and_output_by_tier():
    core, add = make_core()
    add("i", 10, 3, "interactive")
    add("b", 20, 4, "batch")
    records = []
    while core.has_work():
        core.step()
        core.publish_stats()
        records.append(core.stats.recent_steps[-1])
    assert [r.step for r in records] == list(range(1, len(records) + 1))
    assert all(not r.interrupted and r.seconds >= 0 and r.threads == 1 for r in records)
    assert [r.ended_at for r in records] == sorted(r.ended_at for r in records)
    # Every prompt token fed once, in its tier's column; every output token counted in its tier.
    assert sum(r.interactive_prompt for r in records) == 10 and sum(r.batch_prompt for r in records) == 20
    assert sum(r.interactive_tokens for r in records) == 3 and sum(r.batch_tokens for r in records) == 4
    # A token sampled from a prompt's last row is not a decode row; each later token is one.
    assert sum(r.interactive_rows for r in records) == 2 and sum(r.batch_rows for r in records) == 3
    tiers = core.stats.tiers
    assert (tiers["interactive"].prompt_tokens, tiers["batch"].prompt_tokens) == (10, 20)
    assert (tiers["interactive"].tokens_generated, tiers["batch"].tokens_generated) == (3, 4)


def test_the_snapshot_keeps_only_the_most_recent_steps():
    core, add = make_core()
    add("b", 8, RECENT_STEPS + 10, "batch")
    while core.has_work():
        core.step()
    core.publish_stats()
    steps = core.stats.recent_steps
    assert len(steps) == RECENT_STEPS
    assert [s.step for s in steps] == list(range(core.stats.steps - RECENT_STEPS + 1, core.stats.steps + 1))
