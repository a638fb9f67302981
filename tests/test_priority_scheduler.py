"""Two-tier priority on the real engine loop over a fake decode backend, one step at a time:
ordering, the choice of preemption victim, exclusive interactive prefill, interrupted steps,
the starvation bound, cancellation in every state, deadlines and per-tier queue bounds.

(Over 300 lines on purpose: every test here shares the step-gated engine fixture; the core and
policy alone, without the thread, are tested in tests/test_engine_core.py.)"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from engine import FinishReason, Priority, QueueFullError
from engine.request import Request
from engine.scheduler import Scheduler
from sampling.params import SamplingParams
from tests.fake_backend import StepGate, expected_tokens, fake_engine, find

GREEDY = dict(temperature=0.0)


def prompt(i: int, n: int = 8) -> list[int]:
    return [0] + [2 + (i * 7 + k) % 50 for k in range(n - 1)]


def ids_in(rows) -> set[str]:
    return {r.request_id for r in rows}


@pytest.fixture
def stepped():
    gate = StepGate()
    engine, runner = fake_engine(gate)
    yield engine, runner, gate
    gate.release()
    engine.close()


def submit_batch(engine, n, max_tokens):
    """b0..b{n-1}, submitted together: the first step admits them at once, so they stay equally
    far along (suspension picks the sequence furthest ahead)."""
    return engine.submit_many([Request(prompt=prompt(i), max_tokens=max_tokens, request_id=f"b{i}",
                                       sampling=SamplingParams(**GREEDY)) for i in range(n)])


def fill_with_batch(engine, gate, n=6, max_tokens=40):
    handles = submit_batch(engine, n, max_tokens)
    gate.step(3)  # admitted, prompts read, decoding
    return handles


def assert_clean(engine, runner):
    """Nothing held: no running or waiting sequence, every KV block free, no cell in llama.cpp's
    (fake) memory, every seq id back in the pool."""
    stats = engine.stats()
    assert stats.running == 0 and sum(stats.waiting.values()) == 0
    assert stats.kv.blocks_used == 0
    assert runner.context.n_cells_held() == 0
    assert engine.core.kv_cache.n_free_ids == engine.config.sequence_ids
    assert engine.stats().kv_cells_used == 0


def test_interactive_preempts_the_most_recent_batch_sequence_and_jumps_the_queue(stepped):
    engine, runner, gate = stepped
    batch = fill_with_batch(engine, gate)  # 4 slots: b0..b3 run, b4 and b5 wait
    assert ids_in(runner.current) == {"b0", "b1", "b2", "b3"}
    handle = engine.submit(prompt(9), max_tokens=5, priority="interactive", request_id="i0", **GREEDY)
    gate.step()
    # b3, admitted last, made room; the interactive request went ahead of b4 and b5.
    assert ids_in(runner.current) == {"i0"}  # its prefill step carries interactive work only
    stats = engine.stats()
    assert stats.tiers["batch"].suspensions == 1 and stats.tiers["batch"].waiting == 3
    assert stats.preemptions == 0  # a slot was all it needed: nobody gave up KV
    assert [s.request_id for s in engine.core.scheduler.waiting[Priority.BATCH]] == ["b3", "b4", "b5"]
    gate.release()
    result = handle.result(10)
    assert list(result.token_ids) == expected_tokens(prompt(9), 5)
    assert result.metrics.ttft_steps == 1  # the very next step
    for i, h in enumerate(batch):  # preempted work resumes and ends exactly as it would have
        r = h.result(10)
        assert r.finish_reason is FinishReason.LENGTH
        assert list(r.token_ids) == expected_tokens(prompt(i), 40)
    assert batch[3].result().metrics.suspensions == 1 and batch[3].result().metrics.preemptions == 0
    # b3 was suspended, not released: it resumed without recomputing a single token.
    assert engine.stats().tokens_prefilled == sum(len(prompt(i)) for i in range(6)) + len(prompt(9))
    assert_clean(engine, runner)


def test_suspension_rotates_over_the_batch_tier_instead_of_hitting_one_sequence_again(stepped):
    engine, runner, gate = stepped
    batch = fill_with_batch(engine, gate, n=4)  # b0..b3 fill the 4 slots, equally far along
    scheduler = engine.core.scheduler
    first = engine.submit(prompt(9), max_tokens=2, priority="interactive", **GREEDY)
    gate.step()
    # b3 was suspended (a tie on progress goes to the most recently admitted) ...
    assert [s.request_id for s in scheduler.waiting[Priority.BATCH]] == ["b3"]
    while not first.done():
        gate.step()
    gate.step()  # ... and resumed once the interactive request finished, now behind the others
    running = {s.request_id: s for s in scheduler.running}
    assert set(running) == {"b0", "b1", "b2", "b3"}
    assert running["b3"].n_generated < running["b2"].n_generated
    engine.submit(prompt(10), max_tokens=2, priority="interactive", **GREEDY)
    gate.step()
    # The next slot comes from one of the sequences furthest ahead, not from b3 a second time.
    assert [s.request_id for s in scheduler.waiting[Priority.BATCH]] == ["b2"]
    gate.release()
    for i, h in enumerate(batch):
        assert list(h.result(10).token_ids) == expected_tokens(prompt(i), 40)
    assert_clean(engine, runner)


def test_displaced_sequences_resume_first_come_first_served():
    scheduler = Scheduler(kv=None, max_running=4, step_token_budget=64)

    def seq(arrival, displaced):
        return SimpleNamespace(request=SimpleNamespace(priority=Priority.BATCH), arrival_order=arrival,
                               admitted_at=1.0 if displaced else None, suspensions=0, state=None)

    early, fresh, earliest, middle = seq(5, True), seq(7, False), seq(2, True), seq(6, True)
    scheduler.waiting[Priority.BATCH].extend([early, fresh])
    scheduler.running.extend([earliest, middle])
    scheduler.suspend(earliest)
    scheduler.suspend(middle)
    # Ahead of work never started, and among themselves in arrival order: a sequence displaced
    # early is not passed over by every one displaced after it.
    assert list(scheduler.waiting[Priority.BATCH]) == [earliest, early, middle, fresh]


def test_an_arriving_interactive_request_interrupts_a_batch_only_step(stepped):
    engine, runner, gate = stepped
    batch = fill_with_batch(engine, gate, n=2)
    in_flight = runner.current
    handle = engine.submit(prompt(9), max_tokens=3, priority="interactive", **GREEDY)
    gate.step()
    assert runner.aborted == [in_flight]  # the step in flight was given up ...
    assert engine.stats().steps_interrupted == 1
    assert ids_in(runner.current) == {handle.request_id}  # ... for the interactive prefill
    gate.release()
    assert handle.result(10).metrics.ttft_steps == 1
    for i, h in enumerate(batch):  # the aborted rows were decoded again, nothing skipped
        assert list(h.result(10).token_ids) == expected_tokens(prompt(i), 40)
    assert_clean(engine, runner)


def test_a_step_past_its_interrupt_window_runs_to_the_end(stepped):
    engine, runner, gate = stepped
    fill_with_batch(engine, gate, n=2)  # decode steps of "0 s" so far: the estimate is 0
    typical = engine.interrupt_window.typical_steps
    for key in [k for k in typical if k[0] == "decode"]:
        typical[key] = 0.2  # as if decode steps took 200 ms
    gate.step()  # this step starts at t = 0
    runner.now[0] = 0.15  # 150 ms in: past half of a typical step
    handle = engine.submit(prompt(9), max_tokens=3, priority="interactive", **GREEDY)
    gate.step()
    assert runner.aborted == [] and ids_in(runner.current) == {handle.request_id}


def test_steps_carrying_interactive_prefill_are_not_interrupted(stepped):
    engine, runner, gate = stepped
    fill_with_batch(engine, gate, n=2)
    engine.submit(prompt(9, n=40), max_tokens=3, priority="interactive", **GREEDY)
    gate.step()
    engine.submit(prompt(10), max_tokens=3, priority="interactive", **GREEDY)
    gate.step()
    assert engine.stats().steps_interrupted == 1  # only the first, batch-only step


def test_an_arrival_interrupts_a_batch_prompt_chunk_and_the_prompt_is_read_once(stepped):
    """A long batch prompt's chunk would hold a chat for a whole step: it is given up too, redone
    after the chat's prompt, and counted as prefilled once."""
    engine, runner, gate = stepped
    batch = [engine.submit(prompt(i, n=200), max_tokens=5, request_id=f"b{i}", **GREEDY) for i in range(2)]
    gate.step()
    in_flight = runner.current
    assert any(r.length > 1 for r in in_flight)  # a prefill step is in flight
    handle = engine.submit(prompt(9), max_tokens=3, priority="interactive", **GREEDY)
    gate.step()
    assert runner.aborted == [in_flight] and ids_in(runner.current) == {handle.request_id}
    gate.release()
    assert handle.result(10).metrics.ttft_steps == 1
    for i, h in enumerate(batch):
        assert list(h.result(10).token_ids) == expected_tokens(prompt(i, n=200), 5)
    prompts = sum(len(prompt(i, n=200)) for i in range(2)) + len(prompt(9))
    assert engine.stats().tokens_prefilled == prompts  # the aborted chunk is not counted twice
    assert_clean(engine, runner)


def test_interruptions_never_cost_batch_more_than_its_bound():
    """Interactive arrivals at every step would abort every batch step; batch work must still
    complete a step in at least one of every 1 / batch_min_share decode calls."""
    gate = StepGate()
    engine, runner = fake_engine(gate, batch_min_share=0.25)
    try:
        batch = [engine.submit(prompt(i), max_tokens=60, request_id=f"b{i}", **GREEDY) for i in range(2)]
        gate.step(2)
        for k in range(40):
            engine.submit(prompt(30 + k), max_tokens=1, priority="interactive", **GREEDY)
            gate.step()
        assert runner.aborted  # interruptions did happen
        run, worst = 0, 0
        for completed, rows in runner.history[2:]:
            run = 0 if completed and ids_in(rows) & {"b0", "b1"} else run + 1
            worst = max(worst, run)
        assert worst <= 3
        gate.release()
        for i, h in enumerate(batch):
            assert list(h.result(10).token_ids) == expected_tokens(prompt(i), 60)
    finally:
        gate.release()
        engine.close()


def test_fifo_mode_keeps_arrival_order_and_never_preempts():
    gate = StepGate()
    engine, runner = fake_engine(gate, priority_scheduling=False)
    try:
        fill_with_batch(engine, gate)
        handle = engine.submit(prompt(9), max_tokens=3, priority="interactive", **GREEDY)
        gate.step()
        assert "b4" not in ids_in(runner.current) and handle.request_id not in ids_in(runner.current)
        assert engine.stats().preemptions == 0 and engine.stats().steps_interrupted == 0
        assert [s.request_id for s in engine.core.scheduler.waiting[Priority.BATCH]] == ["b4", "b5"]
        gate.release()
        assert handle.result(10).finish_reason is FinishReason.LENGTH
        assert engine.stats().tiers["batch"].finished >= 1  # a batch request was served first
    finally:
        gate.release()
        engine.close()


def test_batch_keeps_its_share_under_a_steady_interactive_stream():
    """A new interactive request every step, each with a long prompt, would keep every step
    exclusive; batch must still run in at least one step of every 1/batch_min_share and keep
    its guaranteed slot, and finish."""
    gate = StepGate()
    engine, runner = fake_engine(gate, batch_min_share=0.25, step_token_budget=64)
    try:
        batch = [engine.submit(prompt(i), max_tokens=100, request_id=f"b{i}", **GREEDY) for i in range(2)]
        gate.step()
        interactive = []
        for k in range(60):
            interactive.append(engine.submit(prompt(20 + k, n=48), max_tokens=2, priority="interactive", **GREEDY))
            gate.step()
        steps = runner.decoded
        batch_ids = {"b0", "b1"}
        gaps, run = [], 0
        for rows in steps:
            if ids_in(rows) & batch_ids:
                gaps.append(run)
                run = 0
            else:
                run += 1
        gaps.append(run)
        assert len(gaps) > 10 and max(gaps) <= 3  # round(1 / 0.25) - 1 steps without batch work, at most
        assert engine.core.scheduler.n_running(Priority.BATCH) >= 1 or all(h.done() for h in batch)
        gate.release()
        for i, h in enumerate(batch):
            assert list(h.result(10).token_ids) == expected_tokens(prompt(i), 100)
        for h in interactive:
            h.result(10)
    finally:
        gate.release()
        engine.close()


@pytest.mark.parametrize("state", ["waiting", "prefilling", "decoding", "suspended", "preempted", "inbox"])
def test_cancel_in_every_state_frees_everything(state):
    gate = StepGate()
    # 128 cells (8 blocks): with two batch sequences holding a block each, a 100-token
    # interactive prompt (7 blocks) fits only once the suspended one releases its KV.
    engine, runner = fake_engine(gate, step_token_budget=16, max_running=2, n_ctx=128 if state == "preempted" else 1024)
    try:
        others = submit_batch(engine, 2, max_tokens=30)
        long_prompt = prompt(7, n=100)
        if state == "inbox":
            target = engine.submit(prompt(5), max_tokens=30, **GREEDY)
            target.cancel()
        elif state == "waiting":
            gate.step(2)
            target = engine.submit(prompt(5), max_tokens=30, **GREEDY)
            gate.step()
            assert find(engine, target.request_id).state.value == "waiting"
            target.cancel()
        elif state == "prefilling":
            others[1].cancel()
            target = engine.submit(long_prompt, max_tokens=30, **GREEDY)
            gate.step(3)
            seq = find(engine, target.request_id)
            assert seq.state.value == "running" and 0 < seq.n_computed < len(long_prompt)
            target.cancel()
        elif state == "decoding":
            target = others[0]
            gate.step(4)
            assert find(engine, target.request_id).n_generated > 0
            target.cancel()
        else:  # displaced by an interactive request: suspended (keeps KV) or preempted (released)
            gate.step(4)
            engine.submit(prompt(9, n=100 if state == "preempted" else 8), max_tokens=30, priority="interactive",
                          **GREEDY)
            gate.step()
            target = others[1]
            seq = find(engine, "b1")
            if state == "suspended":
                assert (seq.suspensions, seq.preemptions) == (1, 0)
                assert seq.state.value == "suspended" and seq.seq_id is not None and seq.n_computed > 0
            else:  # suspended first, then released for the interactive prompt's KV blocks
                assert (seq.suspensions, seq.preemptions) == (1, 1)
                assert seq.state.value == "waiting" and seq.seq_id is None and seq.n_computed == 0
            target.cancel()
        gate.step()
        assert target.result(5).finish_reason is FinishReason.CANCELLED
        assert find(engine, target.request_id) is None
        gate.release()
        for h in others:
            h.result(10)
        deadline = time.monotonic() + 10
        while not engine.is_idle() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert_clean(engine, runner)
    finally:
        gate.release()
        engine.close()


def test_deadlines_end_waiting_and_running_requests_with_timeout():
    gate = StepGate()
    engine, runner = fake_engine(gate, max_running=1)
    try:
        running = engine.submit(prompt(1), max_tokens=500, timeout=0.2, **GREEDY)
        waiting = engine.submit(prompt(2), max_tokens=5, timeout=0.2, **GREEDY)
        gate.step(3)
        assert find(engine, waiting.request_id).state.value == "waiting"
        time.sleep(0.25)
        gate.step()
        for handle in (running, waiting):
            result = handle.result(5)
            assert result.finish_reason is FinishReason.TIMEOUT and "0.2 s" in result.error
        assert len(running.result().token_ids) >= 2  # what it generated before the deadline is kept
        assert waiting.result().token_ids == ()
        gate.release()
        assert_clean(engine, runner)
    finally:
        gate.release()
        engine.close()


def test_each_tier_has_its_own_bounded_queue():
    gate = StepGate()
    engine, runner = fake_engine(gate, max_running=1, max_waiting=2, max_waiting_interactive=1)
    try:
        engine.submit(prompt(0), max_tokens=50, **GREEDY)
        gate.step()  # running, so the queues below are waiting
        engine.submit_many([prompt(1), prompt(2)], max_tokens=5, **GREEDY)
        with pytest.raises(QueueFullError, match="batch queue is full"):
            engine.submit(prompt(3), max_tokens=5, **GREEDY)
        interactive = engine.submit(prompt(4), max_tokens=5, priority="interactive", **GREEDY)
        with pytest.raises(QueueFullError, match="interactive queue is full"):
            engine.submit(prompt(5), max_tokens=5, priority="interactive", **GREEDY)
        with pytest.raises(QueueFullError):  # all or nothing
            engine.submit_many([prompt(6), prompt(7)], max_tokens=5, priority="interactive", **GREEDY)
        gate.step()
        tiers = engine.stats().tiers  # the interactive request took the only slot
        assert (tiers["batch"].waiting, tiers["interactive"].running, tiers["batch"].suspensions) == (3, 1, 1)
        gate.release()
        assert interactive.result(10).finish_reason is FinishReason.LENGTH
    finally:
        gate.release()
        engine.close()


def test_invalid_timeout_and_priority_are_refused():
    engine, _ = fake_engine()
    try:
        for bad in (0, -1, float("inf"), "5", True):
            with pytest.raises(ValueError, match="timeout"):
                engine.submit(prompt(0), timeout=bad)
        with pytest.raises(ValueError, match="priority"):
            engine.submit(prompt(0), priority="urgent")
        assert engine.stats().running == 0 and engine.is_idle()
    finally:
        engine.close()
