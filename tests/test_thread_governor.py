"""The thread governor against simulated step costs: it keeps the fastest thread count, finds
the other one when a neighbour arrives or leaves, aborts a losing probe early, and is not fooled
by steps of another shape or by one odd step."""
from __future__ import annotations

import itertools

from engine.thread_governor import ThreadGovernor, step_shape
from tests.fake_backend import FakeInterrupter

DECODE = (16, 16)  # 16 decode rows, each with logits
PREFILL = (200, 4)  # prompt chunks: far cheaper per unit of work than decode rows


class Machine:
    """Seconds per unit of work of a decode step for each thread count, changeable mid-run;
    prefill steps cost `prefill_discount` of that per unit."""

    def __init__(self, cost: dict[int, float], prefill_discount: float = 1.0) -> None:
        self.cost = cost
        self.prefill_discount = prefill_discount
        self.now = 0.0
        self.interrupter = FakeInterrupter()
        self.governor = ThreadGovernor(2, self.interrupter, clock=lambda: self.now)
        self.used: list[int] = []
        self.slow_next = 1.0  # multiplies the next step's cost once (a hiccup)

    def step(self, shape: tuple[int, int] = DECODE) -> None:
        threads = self.governor.choose(*shape)
        self.used.append(threads)
        self.governor.begin()
        tokens, outputs = shape
        per_unit = self.cost[threads] * (self.prefill_discount if tokens > outputs else 1.0)
        took = per_unit * (tokens + outputs) * self.slow_next
        self.slow_next = 1.0
        deadline = self.governor._deadline  # the watchdog's timer runs in real time; simulate it
        if deadline is not None and took > deadline:
            self.now += deadline
            self.governor.end(completed=False)
            return
        self.now += took
        self.governor.end(completed=True)

    def run(self, seconds: float, shapes=itertools.repeat(DECODE)) -> list[int]:
        start, first = self.now, len(self.used)
        shapes = iter(shapes)
        while self.now - start < seconds:
            self.step(next(shapes))
        return self.used[first:]


def test_quiet_machine_keeps_all_threads_and_probes_ever_less_often():
    m = Machine({2: 0.005, 1: 0.009})
    used = m.run(120.0)
    assert m.governor.current == 2 and m.governor.switches == 0
    probes = [i for i, t in enumerate(used) if t == 1]
    assert 3 <= len(probes) <= 10  # back-off: 2, 4, 8, 16, 30, 30 ... seconds apart
    assert len(probes) / len(used) < 0.01


def test_a_neighbour_sends_it_to_one_thread_and_its_departure_back_to_two():
    m = Machine({2: 0.005, 1: 0.009})
    m.run(10.0)
    m.cost[2] = 0.08  # a busy process arrives: two-thread steps now 16 times slower
    m.run(10.0)
    assert m.governor.current == 1
    used = m.run(60.0)
    assert used.count(2) <= 10  # probes only (every 8 s at most once backed off), each cut short
    assert m.governor.steps_cut >= 1
    m.cost[2] = 0.005  # it leaves
    left = m.now
    while m.governor.current == 1:
        m.step()
    assert m.now - left <= 8.5  # found at the next probe, not after a 30 s back-off
    assert m.governor.switches == 2


def test_a_single_thread_count_never_probes():
    governor = ThreadGovernor(1, FakeInterrupter(), clock=lambda: 100.0)
    assert governor.candidates == [1] and governor.choose(4, 4) == 1


def test_adaptive_off_keeps_the_configured_count():
    now = [0.0]
    governor = ThreadGovernor(2, FakeInterrupter(), adaptive=False, clock=lambda: now[0])
    for _ in range(100):
        assert governor.choose(4, 4) == 2
        governor.begin()
        now[0] += 1.0
        governor.end(completed=True)


def test_costs_are_compared_only_between_steps_of_the_same_shape():
    assert step_shape(*DECODE) != step_shape(*PREFILL)
    assert step_shape(16, 16) == step_shape(20, 20) != step_shape(3, 3)
    # Prompt steps deep in a long prompt are another shape than those of a fresh one; decode is not split.
    assert step_shape(256, 1, 3_000) != step_shape(256, 1, 23_000) == step_shape(256, 1, 20_000)
    assert step_shape(16, 16, 100) == step_shape(16, 16, 20_000)
    # One thread is 1.6x slower on every step, but a one-thread prefill costs less per unit than
    # a two-thread decode: weighing the one against the other would switch to the slower count.
    m = Machine({2: 0.003, 1: 0.0048}, prefill_discount=0.4)
    pattern = itertools.cycle([PREFILL] + [DECODE] * 5)
    m.run(300.0, pattern)
    assert m.governor.current == 2 and m.governor.switches == 0


def test_one_slow_step_does_not_make_it_switch():
    m = Machine({2: 0.003, 1: 0.0048})
    for _ in range(60):
        m.run(1.0)
        m.slow_next = 3.0  # a lone hiccup at two threads, as any shared machine has
    m.run(5.0)
    assert m.governor.current == 2 and m.governor.switches == 0


def test_a_neighbour_arrival_costs_one_short_step_not_a_stalled_one():
    m = Machine({2: 0.003, 1: 0.0048})
    m.run(10.0)
    m.cost[2] = 0.06  # a neighbour takes a core: each two-thread step would take ~2 s
    cut_before, arrived = m.governor.steps_cut, m.now
    while m.governor.current == 2:
        m.step()
    assert m.now - arrived < (4 * 0.003 + 0.0048) * 32 * 1.01  # one step cut at 4x its cost, one probe
    assert m.governor.steps_cut == cut_before + 1


def test_the_watchdog_cuts_a_late_step_and_leaves_no_thread_behind(monkeypatch):
    import time

    from engine import thread_governor

    monkeypatch.setattr(thread_governor, "GOVERNOR_WATCHDOG_IDLE_S", 0.2)
    interrupter = FakeInterrupter()
    watchdog = thread_governor._Watchdog(interrupter)
    watchdog.arm(0.05)
    thread = watchdog._thread
    time.sleep(0.3)
    assert interrupter.interrupted  # the deadline passed with the step still running
    interrupter.reset()
    watchdog.arm(0.3)
    watchdog.disarm()  # the step ended in time
    time.sleep(0.4)
    assert not interrupter.interrupted  # its deadline passed, disarmed
    time.sleep(0.5)
    assert thread is not None and not thread.is_alive()
    watchdog.arm(0.05)  # and a later step gets a new one
    time.sleep(0.3)
    assert interrupter.interrupted
    interrupter.reset()
    watchdog.arm(5.0)
    time.sleep(0.05)  # the thread now sleeps until that deadline
    watchdog.disarm()
    watchdog.arm(0.05)  # earlier than the thread's own wake-up: it must be woken for it
    time.sleep(0.3)
    assert interrupter.interrupted


def test_routine_probes_skip_long_prompt_steps():
    m = Machine({2: 0.005, 1: 0.009}, prefill_discount=0.5)
    long_chunk = (256, 0)  # 256 x 2.5 ms = 0.64 s a step, at two threads
    used = m.run(50.0, itertools.repeat(long_chunk))
    assert 1 not in used  # 50 s of long steps: no probe (at one thread each would run 1.15 s)
    used = m.run(5.0)  # short decode steps: the probe that was due comes at once
    assert used[3] == 1  # after the three steps that give their shape a cost to compare with
    used = m.run(20.0, itertools.repeat(long_chunk))
    assert 1 not in used
    used = m.run(45.0, itertools.repeat(long_chunk))
    assert used.count(1) == 1  # a minute after the last probe, even a long step is probed
