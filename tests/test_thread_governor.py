"""The thread governor against simulated step costs: it keeps the fastest thread count, finds
the other one when a neighbour arrives or leaves, and aborts a losing probe early."""
from __future__ import annotations

from engine.thread_governor import ThreadGovernor
from tests.fake_backend import FakeInterrupter


class Machine:
    """Seconds per unit of work for each thread count, changeable mid-run."""

    def __init__(self, cost: dict[int, float]) -> None:
        self.cost = cost
        self.now = 0.0
        self.interrupter = FakeInterrupter()
        self.governor = ThreadGovernor(2, self.interrupter, clock=lambda: self.now)
        self.used: list[int] = []

    def step(self, work: int = 16) -> None:
        threads = self.governor.choose(work)
        self.used.append(threads)
        self.governor.begin()
        took = self.cost[threads] * work
        deadline = self.governor._deadline  # the watchdog's timer runs in real time; simulate it
        if deadline is not None and took > deadline:
            self.now += deadline
            self.governor.end(completed=False)
            return
        self.now += took
        self.governor.end(completed=True)

    def run(self, seconds: float) -> list[int]:
        start, first = self.now, len(self.used)
        while self.now - start < seconds:
            self.step()
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
    assert used.count(2) <= 6  # probes only, each cut short
    assert m.governor.probes_aborted >= 1
    m.cost[2] = 0.005  # it leaves
    m.run(40.0)
    assert m.governor.current == 2 and m.governor.switches == 2


def test_a_single_thread_count_never_probes():
    governor = ThreadGovernor(1, FakeInterrupter(), clock=lambda: 100.0)
    assert governor.candidates == [1] and governor.choose(8) == 1


def test_adaptive_off_keeps_the_configured_count():
    now = [0.0]
    governor = ThreadGovernor(2, FakeInterrupter(), adaptive=False, clock=lambda: now[0])
    for _ in range(100):
        assert governor.choose(8) == 2
        governor.begin()
        now[0] += 1.0
        governor.end(completed=True)
