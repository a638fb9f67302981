"""How many CPU threads each llama_decode uses, chosen from the step times it measures.

ggml's CPU threads meet at a barrier after every graph node (hundreds per step). When another
runnable process shares the cores, one of them is regularly descheduled and the others wait
for it at every barrier: on the 2-core machine a busy neighbour made two-thread steps 5 to 20
times slower, while one thread kept its whole core and its speed (README, "Serving on a shared
machine"). No setting is right for both cases, so the governor measures: it keeps a moving
cost per unit of work for each thread count, runs the cheapest, and now and then probes the
others. A probe with more threads is aborted (and the step redone) as soon as it is slower
than the current count would have been, so probing under a neighbour costs little.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

_SMOOTHING = 0.3  # weight of the newest step in a thread count's moving cost
_SWITCH_MARGIN = 1.15  # another count must be this much cheaper before the governor switches
_STALL = 4.0  # a step this many times its expected cost makes the governor try the others
_FIRST_PROBE_S = 2.0  # seconds before the first probe, then between probes while they agree
_MAX_PROBE_S = 30.0


class Interrupter(Protocol):
    def interrupt(self) -> None: ...


class ThreadGovernor:
    """Engine thread only, except the probe watchdog, which only interrupts."""

    def __init__(self, max_threads: int, interrupter: Interrupter, adaptive: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.max_threads = max_threads
        self.candidates = sorted({max_threads, max(1, max_threads - 1), 1}) if adaptive else [max_threads]
        self.current = max_threads
        self.switches = 0  # times the running thread count changed
        self.probes_aborted = 0
        self._interrupter = interrupter
        self._clock = clock
        self._cost: dict[int, float] = {}  # threads -> seconds per unit of work, moving
        self._measured_at: dict[int, float] = {}
        self._probe_every = _FIRST_PROBE_S
        self._started = clock()
        self._threads = max_threads  # of the step in flight
        self._began = 0.0
        self._work = 0
        self._deadline: float | None = None
        self._step_id = 0
        self._lock = threading.Lock()

    def choose(self, work: int) -> int:
        """The thread count for the next step, whose size is `work` (tokens plus output rows)."""
        self._work = max(1, work)
        self._threads, self._deadline = self.current, None
        probe = self._due_probe()
        if probe is not None:
            self._threads = probe
            expected = self._cost.get(self.current)
            if probe > self.current and expected is not None:
                # More threads is a gamble under a neighbour: stop once it is clearly losing.
                self._deadline = _SWITCH_MARGIN * expected * self._work
        return self._threads

    def begin(self) -> None:
        """The step's llama_decode starts now."""
        self._began = self._clock()
        with self._lock:
            self._step_id += 1
            step_id = self._step_id
        if self._deadline is not None:
            timer = threading.Timer(self._deadline, self._abort_probe, args=(step_id,))
            timer.daemon = True
            timer.start()

    def end(self, completed: bool) -> bool:
        """The decode returned; True if it was this governor's probe that aborted it."""
        elapsed = self._clock() - self._began
        with self._lock:
            self._step_id += 1  # a late watchdog finds its step gone
        threads, cost = self._threads, elapsed / self._work
        aborted_probe = not completed and self._deadline is not None and elapsed >= 0.999 * self._deadline
        if not (completed or aborted_probe):
            return False  # aborted for an interactive arrival: it says nothing about speed
        previous = self._cost.get(threads)
        self.probes_aborted += aborted_probe
        if previous is None or threads != self.current:
            # A probe is a fresh look (an aborted one a lower bound: it was at least this slow).
            self._cost[threads] = cost
        else:
            self._cost[threads] = (1 - _SMOOTHING) * previous + _SMOOTHING * cost
        self._measured_at[threads] = self._clock()
        self._settle(threads, stalled=previous is not None and cost > _STALL * previous)
        return aborted_probe

    # ---- decisions ------------------------------------------------------------------------------
    def _due_probe(self) -> int | None:
        now = self._clock()
        stale = [t for t in self.candidates if t != self.current
                 and now - self._measured_at.get(t, self._started) >= self._probe_every]
        # The nearest count first: one step away from what works.
        return min(stale, key=lambda t: abs(t - self.current), default=None)

    def _settle(self, threads: int, stalled: bool) -> None:
        best = min(self._cost, key=self._cost.__getitem__)
        current_cost = self._cost.get(self.current)
        if best != self.current and current_cost is not None and self._cost[best] * _SWITCH_MARGIN < current_cost:
            self.current = best
            self.switches += 1
            self._probe_every = _FIRST_PROBE_S  # conditions changed: look again soon
        elif threads != self.current:  # a probe that confirmed the current count
            self._probe_every = min(_MAX_PROBE_S, self._probe_every * 2)
        elif stalled:  # a sudden stall: let the other counts have the very next step
            for t in self.candidates:
                if t != self.current:
                    self._measured_at[t] = self._clock() - self._probe_every

    def _abort_probe(self, step_id: int) -> None:
        with self._lock:
            if step_id == self._step_id:
                self._interrupter.interrupt()
