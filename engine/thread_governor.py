"""How many CPU threads each llama_decode uses, chosen from the step times it measures.

ggml's CPU threads meet at a barrier after every graph node (hundreds per step). When another
runnable process shares the cores, one of them is regularly descheduled and the others wait
for it at every barrier: on the 2-core machine a busy neighbour made two-thread steps 5 to 20
times slower, while one thread kept its whole core and its speed (README, "Serving on a shared
machine"). No setting is right for both cases, so the governor measures: it runs one thread
count, now and then probes another on a single step, and switches when the probe beat what the
current count costs on steps of the same shape. A probe with more threads is aborted (and the
step redone) as soon as it is slower than the current count would have been, so probing under
a neighbour costs little.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from typing import Callable, Protocol

log = logging.getLogger("cobatch.engine")

_RECENT = 3  # step costs kept per thread count and shape: their median shrugs off one odd step
_SWITCH_MARGIN = 1.15  # a probe must be this much cheaper than the current count to switch
_STALL = 2.0  # a step this many times its shape's median counts as stalled
_STALLS_BEFORE_PROBE = 2  # stalled steps in a row (the median has moved) before probing at once
_FIRST_PROBE_S = 2.0  # seconds before the first probe, then between probes while they agree
_MAX_PROBE_S = 30.0

Shape = tuple[bool, int]


def step_shape(tokens: int, outputs: int) -> Shape:
    """Steps whose cost per unit of work is comparable. A prompt token costs far less than a
    decode row (which also pays the output projection) and small steps carry more fixed cost, so
    a one-thread probe on a prefill must not be weighed against two-thread decode steps."""
    return tokens == outputs, (tokens + outputs).bit_length()


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
        self._recent: dict[tuple[int, Shape], deque[float]] = {}  # seconds per unit of work
        self._probed_at: dict[int, float] = {}
        self._probe_every = _FIRST_PROBE_S
        self._started = clock()
        self._stalls = 0  # stalled current-count steps in a row
        self._threads = max_threads  # of the step in flight
        self._shape: Shape = (True, 0)
        self._began = 0.0
        self._work = 0
        self._deadline: float | None = None
        self._step_id = 0
        self._lock = threading.Lock()

    def choose(self, tokens: int, outputs: int) -> int:
        """The thread count for the next step: `tokens` batch rows, `outputs` of them with logits."""
        self._work = max(1, tokens + outputs)
        self._shape = step_shape(tokens, outputs)
        self._threads, self._deadline = self.current, None
        expected = self._expected(self.current)
        probe = self._due_probe() if expected is not None else None  # a probe needs a yardstick
        if probe is not None and expected is not None:
            self._threads = probe
            if probe > self.current:
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
        cost = elapsed / self._work
        aborted_probe = not completed and self._deadline is not None and elapsed >= 0.999 * self._deadline
        if not (completed or aborted_probe):
            return False  # aborted for an interactive arrival: it says nothing about speed
        self.probes_aborted += aborted_probe
        if self._threads == self.current:
            expected = self._expected(self.current)
            stalled = expected is not None and cost > _STALL * expected
            self._stalls = self._stalls + 1 if stalled else 0
            self._record(self.current, cost)
        else:
            self._judge_probe(self._threads, cost)  # an aborted probe's cost is a lower bound
        return aborted_probe

    # ---- decisions ------------------------------------------------------------------------------
    def _expected(self, threads: int) -> float | None:
        recent = self._recent.get((threads, self._shape))
        return statistics.median(recent) if recent and len(recent) == _RECENT else None

    def _record(self, threads: int, cost: float) -> None:
        self._recent.setdefault((threads, self._shape), deque(maxlen=_RECENT)).append(cost)

    def _due_probe(self) -> int | None:
        now = self._clock()
        urgent = self._stalls >= _STALLS_BEFORE_PROBE
        stale = [t for t in self.candidates if t != self.current
                 and (urgent or now - self._probed_at.get(t, self._started) >= self._probe_every)]
        # The nearest count first: one step away from what works.
        return min(stale, key=lambda t: abs(t - self.current), default=None)

    def _judge_probe(self, threads: int, cost: float) -> None:
        expected = self._expected(self.current)
        self._probed_at[threads] = self._clock()
        self._stalls = 0
        if expected is not None and cost * _SWITCH_MARGIN < expected:
            log.info("decode threads %d -> %d: %.2f ms against %.2f ms per unit of work",
                     self.current, threads, 1e3 * cost, 1e3 * expected)
            # What the new count cost before describes other conditions: start its record afresh.
            self._recent = {key: costs for key, costs in self._recent.items() if key[0] != threads}
            self._record(threads, cost)
            self.current = threads
            self.switches += 1
            self._probe_every = _FIRST_PROBE_S  # conditions changed: look again soon
        else:  # the probe confirmed the current count
            self._probe_every = min(_MAX_PROBE_S, self._probe_every * 2)

    def _abort_probe(self, step_id: int) -> None:
        with self._lock:
            if step_id == self._step_id:
                self._interrupter.interrupt()
