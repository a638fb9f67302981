"""The engine core and its scheduling policies driven directly, one step at a time: no engine
thread, no private attributes. The fake backend's "model" makes each sequence's tokens a
function of its own tokens, so any displacement that lost or repeated work would show."""
from __future__ import annotations

import time

import pytest

from engine import EngineConfig, FifoPolicy, FinishReason, Priority, TwoTierPolicy
from engine.core import EngineCore
from engine.intake import Intake
from engine.interrupt_window import InterruptWindow
from engine.outputs import append_token
from engine.tuning import DEEP_PROMPT_CHUNK, DEEP_PROMPT_FROM
from bindings import DecodeOutcome
from tests.fake_backend import FakeCore as Core
from tests.fake_backend import FakeInterrupter, FakeModel, FakeRunner, expected_tokens


def prompt(i: int, n: int = 8) -> list[int]:
    return [0] + [2 + (i * 7 + k) % 50 for k in range(n - 1)]


def test_step_decodes_every_running_sequence_and_finishes_them_exactly():
    c = Core()
    seqs = [c.add(f"b{i}", prompt(i), max_tokens=12) for i in range(6)]
    c.core.step()
    assert c.rows() == {"b0", "b1", "b2", "b3"}  # four slots
    c.run_to_end()
    for i, seq in enumerate(seqs):
        result = seq.handle.result(0)
        assert result.finish_reason is FinishReason.LENGTH
        assert list(result.token_ids) == expected_tokens(prompt(i), 12)
    assert sorted(c.finished) == [f"b{i}" for i in range(6)]
    c.core.publish_stats()
    stats = c.core.stats
    assert stats.kv_cells_used == 0 and stats.kv.blocks_used == 0 and stats.running == 0
    assert c.core.kv_cache.n_free_ids == c.core.config.sequence_ids


def test_an_interactive_arrival_suspends_the_batch_sequence_furthest_ahead_and_runs_alone():
    c = Core()
    batch = [c.add(f"b{i}", prompt(i), max_tokens=30) for i in range(4)]
    for _ in range(3):
        c.core.step()
    interactive = c.add("i0", prompt(9), max_tokens=4, priority="interactive")
    c.core.step()
    assert c.rows() == {"i0"}  # its prompt alone: a short step
    waiting = list(c.core.scheduler.waiting[Priority.BATCH])
    assert [s.request_id for s in waiting] == ["b3"] and waiting[0].seq_id is not None  # kept its KV
    c.core.publish_stats()
    assert c.core.stats.suspensions == 1 and c.core.stats.preemptions == 0
    c.run_to_end()
    assert list(interactive.handle.result(0).token_ids) == expected_tokens(prompt(9), 4)
    for i, seq in enumerate(batch):
        assert list(seq.handle.result(0).token_ids) == expected_tokens(prompt(i), 30)
    assert batch[3].handle.result(0).metrics.suspensions == 1


def _blocks_cover_every_computed_token(c: Core) -> None:
    holding = list(c.core.scheduler.running) + [s for q in c.core.scheduler.waiting.values() for s in q]
    for seq in holding:
        if seq.seq_id is not None:
            assert c.core.kv_cache.ledger.n_tokens(seq.seq_id) >= seq.n_computed, seq.request_id


def test_a_sequence_adopted_between_steps_leaves_its_victim_blocks_for_every_token():
    # The victim was given a token by the step before the adoption, after that step reserved its
    # blocks. Once, resuming on its last token, it held more tokens than blocks, and its release
    # failed: the request was lost and the engine went idle.
    c = Core(prefix_cache=True, block_size=4)
    batch = [c.add(f"b{i}", prompt(i), max_tokens=6) for i in range(4)]
    for _ in range(5):
        c.core.step()
    lane = c.intake.sequence(prompt(9), dict(max_tokens=3, request_id="i0", priority="interactive", temperature=0.0))
    append_token(lane, expected_tokens(prompt(9), 1)[0], FakeModel.eog_tokens, c.core.n_ctx)
    lane.lane_gave_first_token(time.perf_counter())
    c.core.adopt(lane, bytes(lane.n_prompt), None)
    assert lane in c.core.scheduler.running and [s.request_id for s in c.core.scheduler.waiting[Priority.BATCH]] == ["b3"]
    while c.core.has_work():
        c.core.step()
        _blocks_cover_every_computed_token(c)
    assert list(lane.handle.result(0).token_ids) == expected_tokens(prompt(9), 3)
    assert lane.handle.result(0).metrics.ttft_steps == 0
    for i, seq in enumerate(batch):
        assert list(seq.handle.result(0).token_ids) == expected_tokens(prompt(i), 6)
    c.core.publish_stats()
    assert c.core.stats.running == 0 and c.core.stats.kv.blocks_used == 0 and c.core.stats.lane_first_tokens == 1


def test_fifo_policy_keeps_arrival_order_and_displaces_nobody():
    c = Core(priority_scheduling=False)
    assert isinstance(c.core.scheduler.policy, FifoPolicy)
    batch = [c.add(f"b{i}", prompt(i), max_tokens=20) for i in range(5)]
    c.core.step()
    interactive = c.add("i0", prompt(9), max_tokens=20, priority="interactive")
    c.core.step()
    assert "i0" not in c.rows() and "b4" not in c.rows()
    c.run_to_end()
    assert batch[4].admitted_at < interactive.admitted_at  # it arrived first
    c.core.publish_stats()
    assert c.core.stats.suspensions == c.core.stats.preemptions == 0


def test_shared_prefix_cells_are_counted_once():
    c = Core(prefix_cache=True, block_size=16)
    system = prompt(1, n=48)
    first = c.add("a", system + [5], max_tokens=2)
    c.run_to_end()
    assert first.handle.done()
    sharers = [c.add(f"s{i}", system + [6 + i], max_tokens=40) for i in range(3)]
    for _ in range(3):
        c.core.step()
    c.core.publish_stats()
    stats = c.core.stats
    assert all(s.cached_tokens == 48 for s in sharers)
    own = sum(s.n_computed - 48 for s in sharers)
    assert stats.kv_cells_used == 48 + own  # the 48 shared cells once, not three times
    assert stats.kv_cells_used <= stats.kv_cells_total
    c.run_to_end()


def test_two_tier_policy_keeps_batch_its_share_of_slots():
    policy = TwoTierPolicy(max_running=8, step_token_budget=64, batch_min_share=0.25)
    assert (policy.batch_slots, policy.batch_tokens, policy.max_batchless_steps) == (2, 16, 3)
    with pytest.raises(ValueError, match="batch_min_share"):
        TwoTierPolicy(max_running=8, step_token_budget=64, batch_min_share=1.0)


def test_interrupt_window_aborts_only_early_in_an_interruptible_step():
    interrupter, now = FakeInterrupter(), [0.0]
    window = InterruptWindow(interrupter, fraction=0.5, clock=lambda: now[0])
    window.begin(interruptible=False)
    assert not window.arrival() and not interrupter.interrupted  # not a step it may abort
    window.end(completed=True)
    assert window.typical_steps == {}  # only interruptible steps train the estimate
    window.begin(interruptible=True)
    now[0] = 0.2
    window.end(completed=True)
    assert window.typical_steps == {("decode", 0): pytest.approx(0.2)}
    window.begin(interruptible=True)
    now[0] += 0.15  # past half of a typical step: finishing it is cheaper
    assert not window.arrival()
    window.end(completed=True)
    window.begin(interruptible=True)
    now[0] += 0.05
    assert window.arrival() and interrupter.interrupted
    assert not window.arrival()  # once per step
    window.end(completed=False)
    assert not interrupter.interrupted  # reset for the next step


def test_interrupt_window_judges_a_step_against_typical_steps_of_its_kind():
    interrupter, now = FakeInterrupter(), [0.0]
    window = InterruptWindow(interrupter, fraction=0.5, clock=lambda: now[0])
    for kind, seconds in (("decode", 0.1), ("mixed", 0.6)):
        window.begin(interruptible=True, kind=kind)
        now[0] += seconds
        window.end(completed=True)
    window.begin(interruptible=True, kind="mixed")
    now[0] += 0.2  # past half of a decode step, early in a prompt chunk's
    assert window.arrival() and interrupter.interrupted
    window.end(completed=False)
    window.begin(interruptible=True, kind="decode")
    now[0] += 0.2
    assert not window.arrival()


def test_interrupt_window_aborts_a_step_planned_before_an_arrival_between_steps():
    interrupter, now = FakeInterrupter(), [0.0]
    window = InterruptWindow(interrupter, fraction=0.5, clock=lambda: now[0])
    window.begin(interruptible=True)
    now[0] = 0.1
    window.end(completed=True)
    assert not window.arrival()  # nothing in flight: the engine may already have planned the next step
    window.begin(interruptible=True)  # it did: only a step planned without the arrival is interruptible
    assert interrupter.interrupted
    window.end(completed=False)
    window.begin(interruptible=True)
    assert not interrupter.interrupted  # once
    window.end(completed=True)
    assert not window.arrival()
    window.begin(interruptible=False)  # the arrival's own prompt step
    assert not interrupter.interrupted


def test_interrupt_window_judges_a_step_against_typical_steps_at_its_thread_count():
    interrupter, now = FakeInterrupter(), [0.0]
    window = InterruptWindow(interrupter, fraction=0.5, clock=lambda: now[0])
    window.begin(interruptible=True, kind="decode", threads=2)
    now[0] += 0.1
    window.end(completed=True)
    window.begin(interruptible=True, kind="decode", threads=1)  # the governor's probe, twice as slow
    now[0] += 0.07  # past half of a two-thread step, early in this one
    assert window.arrival() and interrupter.interrupted
    window.end(completed=False)


def _window_with_typical_steps(*kinds: str):
    """An interrupt window that has seen one 0.5 s step of each kind."""
    interrupter, now = FakeInterrupter(), [0.0]
    window = InterruptWindow(interrupter, fraction=0.5, clock=lambda: now[0])
    for kind in kinds:
        window.begin(interruptible=True, kind=kind)
        now[0] += 0.5
        window.end(completed=True)
    return interrupter, now, window


def test_interrupt_window_lets_an_arrival_abort_a_prompt_only_step_until_near_its_end():
    interrupter, now, window = _window_with_typical_steps("prompt", "mixed")
    window.begin(interruptible=True, kind="mixed")
    now[0] += 0.4  # decode rows in it: its end is the rows' output projection, which cannot be aborted
    assert not window.arrival()
    window.end(completed=True)
    window.begin(interruptible=True, kind="prompt")
    now[0] += 0.4  # prompt chunks alone: nothing long is left that an abort could not cut
    assert window.arrival() and interrupter.interrupted
    window.end(completed=False)


def _batch_rows_beside(c: Core, interactive) -> list[set[str]]:
    """Step until the interactive sequence finishes; the batch rows of each step it decoded in."""
    served = []
    while not interactive.handle.done():
        c.core.step()
        if not interactive.handle.done():
            assert interactive.request_id in c.rows()
            served.append(c.rows() - {interactive.request_id})
    return served


def test_while_interactive_sequences_decode_batch_rows_are_capped_and_rotate():
    c = Core(max_running=9, interactive_batch_rows=2, batch_min_share=0.1)
    batch = [c.add(f"b{i}", prompt(i), max_tokens=40) for i in range(8)]
    for _ in range(2):
        c.core.step()
    interactive = c.add("i0", prompt(9), max_tokens=12, priority="interactive")
    c.core.step()
    assert c.rows() == {"i0"}  # its prompt alone
    served = _batch_rows_beside(c, interactive)
    assert all(len(rows) <= 2 for rows in served)
    assert set().union(*served[:4]) == {f"b{i}" for i in range(8)}  # every batch sequence moved
    c.run_to_end()
    assert list(interactive.handle.result(0).token_ids) == expected_tokens(prompt(9), 12)
    for i, seq in enumerate(batch):
        assert list(seq.handle.result(0).token_ids) == expected_tokens(prompt(i), 40)


def test_interactive_batch_rows_must_be_positive():
    with pytest.raises(ValueError, match="interactive_batch_rows"):
        EngineConfig(interactive_batch_rows=0)


class _KvFullRunner(FakeRunner):
    """Reports llama.cpp's "no KV slot" for the next `full` decodes, computing nothing."""

    full = 0

    def decode(self):
        if self.full:
            self.full -= 1
            self.history.append((False, self.current))
            return DecodeOutcome.KV_FULL
        return super().decode()


def _kv_full_core(**overrides) -> Core:
    c = Core(**overrides)
    c.runner = _KvFullRunner(c.core.n_ctx)
    c.core = EngineCore(FakeModel(), c.runner, c.core.config, on_finished=lambda s: c.finished.append(s.request_id))
    return c


def test_kv_full_step_preempts_batch_work_never_an_interactive_sequence():
    c = _kv_full_core()
    batch = c.add("b0", prompt(0), max_tokens=12)
    c.core.step()
    interactive = c.add("i0", prompt(1), max_tokens=12, priority="interactive")
    c.core.step()
    assert c.core.scheduler.running == [batch, interactive]  # the interactive one is the latest admitted
    c.runner.full = 1
    c.core.step()
    assert interactive.preemptions == 0 and batch.preemptions == 1
    c.core.publish_stats()
    assert c.core.stats.tiers["batch"].preemptions == 1 and c.core.stats.tiers["interactive"].preemptions == 0
    c.run_to_end()
    for i, seq in enumerate((batch, interactive)):
        assert list(seq.handle.result(0).token_ids) == expected_tokens(prompt(i), 12)


def test_kv_full_with_one_sequence_running_fails_it_and_frees_its_cells():
    c = _kv_full_core()
    seq = c.add("b0", prompt(0), max_tokens=12)
    c.runner.full = 1
    c.core.step()
    result = seq.handle.result(0)
    assert result.finish_reason is FinishReason.ERROR and "KV cache" in result.error
    c.core.publish_stats()
    assert c.core.stats.kv.blocks_used == 0 and c.core.kv_cache.n_free_ids == c.core.config.sequence_ids


def _synthetic_machine(c: Core, fixed: float, per_row: float) -> None:
    """Teach the core's step-cost model a machine whose steps cost fixed + per_row x rows; the fake
    backend's own steps (no time at all) are kept out of it."""
    for rows in list(range(1, 17)) * 4:
        c.core.step_cost.record(rows, rows, fixed + per_row * rows)
    c.core.step_cost.record = lambda *args: None


@pytest.mark.parametrize("priority_scheduling", [True, False])
def test_a_deep_batch_prompt_is_read_in_short_chunks_only_where_arrivals_may_abort_them(priority_scheduling):
    # Past DEEP_PROMPT_FROM cells a chunk's attention makes long graph nodes, and an arrival's
    # abort lands only between nodes; FIFO never aborts, so it keeps whole chunks.
    c = Core(n_ctx=12288, step_token_budget=256, priority_scheduling=priority_scheduling)
    long = c.add("long", prompt(1, 10_000), max_tokens=1)
    c.run_to_end()
    chunks = [r for step in c.runner.decoded for r in step if r.request_id == "long"]
    assert sum(r.length for r in chunks) == 10_000 and long.handle.result(0).finish_reason is FinishReason.LENGTH
    deep = [r.length for r in chunks if r.start >= DEEP_PROMPT_FROM]
    assert all(r.length == 256 for r in chunks if r.start + 256 <= DEEP_PROMPT_FROM)
    assert max(deep) == (DEEP_PROMPT_CHUNK if priority_scheduling else 256)


def test_latency_target_grants_the_batch_rows_that_fit_and_rotates_them():
    c = Core(max_running=12, batch_min_share=0.1, interactive_token_ms=100)
    batch = [c.add(f"b{i}", prompt(i), max_tokens=60) for i in range(8)]
    c.core.step()
    _synthetic_machine(c, fixed=0.005, per_row=0.010)
    interactive = c.add("i0", prompt(9), max_tokens=12, priority="interactive")
    c.core.step()
    assert c.rows() == {"i0"}  # its prompt alone
    # Planned: the 100 ms target over the starting calibration 1.25 (intervals run longer than
    # steps) is 80 ms; the interactive row and the fixed part take 15 ms, and each batch row 10 ms
    # more, so 6 of the 8 batch rows fit.
    served = _batch_rows_beside(c, interactive)
    assert all(len(rows) == 6 for rows in served)
    assert set().union(*served[:2]) == {f"b{i}" for i in range(8)}  # the least advanced go first
    c.core.publish_stats()
    stats = c.core.stats
    assert stats.interactive_token_target_ms == 100
    assert stats.latency_bounded_steps >= len(served) and stats.batch_rows_granted == 6 * stats.latency_bounded_steps
    assert len(interactive.handle.result(0).metrics.inter_token_ms) == 11  # one interval per later token
    c.run_to_end()
    for i, seq in enumerate(batch):
        assert list(seq.handle.result(0).token_ids) == expected_tokens(prompt(i), 60)


def test_latency_target_still_lets_batch_work_progress_on_a_slow_machine():
    c = Core(max_running=6, batch_min_share=0.25, interactive_token_ms=50)
    [c.add(f"b{i}", prompt(i), max_tokens=60) for i in range(4)]
    c.core.step()
    _synthetic_machine(c, fixed=0.040, per_row=0.030)  # one interactive row alone misses the target
    interactive = c.add("i0", prompt(9), max_tokens=20, priority="interactive")
    c.core.step()
    with_batch = 0
    for _ in range(16):
        c.core.step()
        with_batch += bool(c.rows() - {"i0"})
    assert not interactive.handle.done()
    assert with_batch == 4  # one step in every 1 / batch_min_share carries a batch row


def test_calibration_rises_after_a_late_token_and_falls_slowly():
    c = Core(max_running=12, batch_min_share=0.1, interactive_token_ms=100)
    [c.add(f"b{i}", prompt(i), max_tokens=60) for i in range(8)]
    c.core.step()
    _synthetic_machine(c, fixed=0.005, per_row=0.010)
    c.add("i0", prompt(9), max_tokens=40, priority="interactive")
    c.core.step()
    c.core.step()  # a bounded step: interactive row, fixed part and 6 batch rows, 75 ms predicted
    policy = c.core.scheduler.policy
    start = policy.calibration
    policy.interactive_intervals([0.150])  # twice the prediction: plan less
    assert policy.calibration > start
    high = policy.calibration
    policy.interactive_intervals([0.050] * 10)
    assert start < policy.calibration < high


def test_interactive_token_target_must_be_positive():
    with pytest.raises(ValueError, match="interactive_token_ms"):
        EngineConfig(interactive_token_ms=-5)
    assert EngineConfig(interactive_token_ms=None).scheduling_policy().token_target_s is None


def _chat_beside_batch(c: Core):
    """Four batch sequences and one interactive sequence decoding beside them."""
    [c.add(f"b{i}", prompt(i), max_tokens=60) for i in range(4)]
    c.core.step()
    chat = c.add("i0", prompt(8), max_tokens=30, priority="interactive")
    c.core.step()
    c.core.step()
    return chat


def test_an_arrivals_prompt_runs_alone_when_the_chats_decoding_can_wait_for_it():
    c = Core(max_running=8, batch_min_share=0.1, interactive_token_ms=100)
    _chat_beside_batch(c)
    # Predicted: the prompt step 5 + 8 x 5 + 5 = 50 ms, then i0's own step 15 ms; over the
    # calibration 1.25 that is 81 ms, within 100: i0 waits, and the arrival's step has one output.
    _synthetic_machine(c, fixed=0.005, per_row=0.010)
    c.add("i1", prompt(9), max_tokens=20, priority="interactive")
    c.core.step()
    assert c.rows() == {"i1"}
    time.sleep(0.04)  # i0 has now waited 40 ms more: its next step carries fewer batch rows
    c.core.step()
    # (100 - 40+) / 1.25 = 48 ms at most: 15 for the two interactive rows, 3 batch rows of 10.
    assert {"i0", "i1"} <= c.rows() and len(c.rows()) <= 2 + 3
    c.core.step()
    assert len(c.rows()) == 2 + 4  # back to back again: (80 - 25) / 10 = 5 rows fit, 4 exist


def test_a_chat_whose_step_was_aborted_counts_that_wait_when_an_arrival_comes():
    c = Core(max_running=8, batch_min_share=0.1, interactive_token_ms=100)
    _chat_beside_batch(c)
    _synthetic_machine(c, fixed=0.005, per_row=0.010)
    c.runner.interrupter.interrupt()  # the step carrying i0's next token is aborted...
    c.core.step()
    c.runner.interrupter.reset()
    time.sleep(0.04)  # ...after running 40 ms; 40 + 81 ms predicted is past the 100 ms target
    c.add("i1", prompt(9), max_tokens=20, priority="interactive")
    c.core.step()
    assert c.rows() == {"i0", "i1"}


def test_an_arrivals_prompt_step_keeps_the_rows_of_chats_that_could_not_wait():
    c = Core(max_running=8, batch_min_share=0.1, interactive_token_ms=100)
    _chat_beside_batch(c)
    _synthetic_machine(c, fixed=0.020, per_row=0.020)  # prompt step 120 ms alone: i0 would miss
    c.add("i1", prompt(9), max_tokens=20, priority="interactive")
    c.core.step()
    assert c.rows() == {"i0", "i1"}  # i1's prompt, and i0's next token: no batch rows


def test_latency_target_floor_also_feeds_batch_prompts():
    c = Core(max_running=6, batch_min_share=0.25, interactive_token_ms=50)
    c.add("i0", prompt(9), max_tokens=40, priority="interactive")
    c.core.step()
    _synthetic_machine(c, fixed=0.040, per_row=0.030)  # one interactive row alone misses the target
    batch = c.add("b0", prompt(0, n=200), max_tokens=4)
    for _ in range(16):
        c.core.step()
    assert 0 < batch.n_computed < 200  # its prompt moves, a share at a time, while the chat goes on


def test_an_arrival_in_the_first_token_lane_aborts_a_prompt_only_step_however_far_it_is():
    interrupter, now, window = _window_with_typical_steps("prompt", "decode")
    window.begin(interruptible=True, kind="decode")
    now[0] += 0.1
    assert not window.lane_started() and not interrupter.interrupted  # the lane runs beside decode rows
    window.end(completed=True)
    window.begin(interruptible=True, kind="prompt")
    now[0] += 0.48  # past 0.9 of a typical one: too late for an arrival of the main queue
    assert not window.arrival()
    assert window.lane_started() and interrupter.interrupted  # the lane does not share the cores with it
    window.end(completed=False)
    window.begin(interruptible=False, kind="prompt")  # an interactive prompt's own step
    assert not window.lane_started() and not interrupter.interrupted


def test_batch_steps_wait_for_the_first_token_lane_a_bounded_time(monkeypatch):
    import engine.core as core_module

    busy = [False]
    config = EngineConfig(n_ctx=1024, max_running=4, step_token_budget=64, n_threads=1, prefix_cache=False,
                          speculative=False)
    runner = FakeRunner(config.n_ctx)
    core = EngineCore(FakeModel(), runner, config, lane_busy=lambda: busy[0])
    intake = Intake(FakeModel(), config.n_ctx, canceller=lambda request_id: None)
    batch = intake.sequence(prompt(1), dict(max_tokens=50, request_id="b", priority="batch", temperature=0.0))
    core.add(batch)
    for _ in range(3):
        assert core.step()
    made = len(batch.tokens)
    busy[0] = True  # the lane computes an arrival's prompt: batch work waits, not sharing the cores
    monkeypatch.setattr(core_module, "LANE_HOLD_MAX_S", 0.05)
    assert not core.step() and not core.step() and len(batch.tokens) == made
    time.sleep(0.06)  # waited its bound: one step of its own, then it may wait again
    assert core.step() and len(batch.tokens) == made + 1
    assert not core.step()
    chat = intake.sequence(prompt(2), dict(max_tokens=50, request_id="i", priority="interactive", temperature=0.0))
    core.add(chat)  # (as a sequence handed over by the lane would be)
    time.sleep(0.06)
    assert core.step()  # the chat's prompt
    assert core.step() and core.step()  # an interactive sequence decoding never waits
    busy[0] = False
    assert core.step()


def test_the_lane_taking_an_arrival_aborts_a_young_step_of_batch_work_alone():
    for kind in ("decode", "mixed"):
        interrupter, now, window = _window_with_typical_steps(kind)
        window.begin(interruptible=True, kind=kind, batch_only=True)
        now[0] += 0.01
        assert window.lane_started() and interrupter.interrupted
        window.end(completed=False)
        interrupter.interrupted = False
        window.begin(interruptible=True, kind=kind, batch_only=True)
        now[0] += 0.9  # late in the step: its output projection cannot be aborted
        assert not window.lane_started() and not interrupter.interrupted
        window.end(completed=True)
        window.begin(interruptible=True, kind=kind, batch_only=False)
        now[0] += 0.01  # interactive rows in it: they do not wait for the lane, nothing to gain
        assert not window.lane_started() and not interrupter.interrupted
        window.end(completed=True)
