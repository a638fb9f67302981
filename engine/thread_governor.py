"""How many CPU threads each llama_decode uses, chosen from the step times it measures.

ggml's CPU threads meet at a barrier after every graph node (hundreds per step). When another
runnable process shares the cores, one of them is regularly descheduled and the others wait
for it at every barrier, so all threads run at the pace of the slowest, while fewer threads can
keep whole cores and their speed (docs/threads.md). No setting is right
for both cases, so the governor measures: it runs one thread count, now and then probes another
on a single step, and switches when the probe beat what the current count costs on steps of the
same shape. Two kinds of step are cut short (aborted and
redone): a probe with more threads once it is slower than the current count would have been, so
probing under a neighbour costs little; and any step running several times its expected cost,
which is how a neighbour's arrival shows, so the governor reacts within one short step instead
of sitting out multi-second stalled ones.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from typing import Callable, Protocol

from engine.ownership import SingleWriter
from engine.tuning import (
    GOVERNOR_FIRST_PROBE_S, GOVERNOR_LONG_STEPS_PROBE_S, GOVERNOR_MAX_PROBE_S, GOVERNOR_MAX_PROBE_UP_S,
    GOVERNOR_QUICK_STEP_S, GOVERNOR_RECENT, GOVERNOR_SEVERE_STALL, GOVERNOR_STALL, GOVERNOR_STALLS_BEFORE_PROBE,
    GOVERNOR_SWITCH_MARGIN, GOVERNOR_WATCHDOG_IDLE_S,
)

log = logging.getLogger("cobatch.engine")

StepShape = tuple[bool, int, int]


def step_shape(tokens: int, outputs: int, depth: int = 0) -> StepShape:
    """Steps whose cost per unit of work is comparable. A prompt token costs far less than a
    decode row (which also pays the output projection) and small steps carry more fixed cost, so
    a one-thread probe on a prefill must not be weighed against two-thread decode steps. A prompt
    token's cost also grows with how deep in its sequence it sits (its attention reads every
    cell before it), so prompt steps are told apart by `depth`, the furthest KV position they
    reach: a one-thread probe on a fresh short prompt must not be weighed against the last
    steps of a long one (it once switched the engine to one thread there)."""
    prefill = tokens != outputs
    return not prefill, (tokens + outputs).bit_length(), depth.bit_length() if prefill else 0


class Interrupter(Protocol):
    def interrupt(self) -> None: ...


class ThreadGovernor(SingleWriter):
    """Engine thread only, except the step watchdog, which only interrupts."""

    def __init__(self, max_threads: int, interrupter: Interrupter, adaptive: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.max_threads = max_threads
        self.candidates = sorted({max_threads, max(1, max_threads - 1), 1}) if adaptive else [max_threads]
        self.current = max_threads
        self.switches = 0  # times the running thread count changed
        self.steps_cut = 0  # steps aborted by the governor (and redone)
        self._clock = clock
        self._recent: dict[tuple[int, StepShape], deque[float]] = {}  # seconds per unit of work
        self._probed_at: dict[int, float] = {}
        self._probe_every = GOVERNOR_FIRST_PROBE_S
        self._started = clock()
        self._stalls = 0  # stalled current-count steps in a row
        self._slowdown = 1.0  # how much slower than its medians the current count just ran
        self._watchdog = _Watchdog(interrupter)
        self._threads = max_threads  # of the step in flight
        self._shape: StepShape = (True, 0, 0)
        self._began = 0.0
        self._work = 0
        self._deadline: float | None = None

    def choose(self, tokens: int, outputs: int, depth: int = 0) -> int:
        """The thread count for the next step: `tokens` batch rows, `outputs` of them with logits,
        reaching KV position `depth` at most."""
        self._work = max(1, tokens + outputs)
        self._shape = step_shape(tokens, outputs, depth)
        self._threads, self._deadline = self.current, None
        expected = self._expected(self.current)
        if expected is None or len(self.candidates) == 1:
            return self._threads  # nothing to compare with yet, or nothing to choose from
        probe = self._due_probe(expected * self._work)
        if probe is None:
            self._deadline = GOVERNOR_SEVERE_STALL * expected * self._work
        else:
            self._threads = probe
            if probe > self.current:
                # More threads is a gamble under a neighbour: stop once it is clearly losing.
                self._deadline = GOVERNOR_SWITCH_MARGIN * self._slowdown * expected * self._work
        return self._threads

    def begin(self) -> None:
        """The step's llama_decode starts now."""
        self._began = self._clock()
        if self._deadline is not None:
            self._watchdog.arm(self._deadline)

    def end(self, completed: bool) -> bool:
        """The decode returned; True if this governor aborted it (the step is simply redone)."""
        elapsed = self._clock() - self._began
        self._watchdog.disarm()
        cost = elapsed / self._work
        cut = not completed and self._deadline is not None and elapsed >= 0.999 * self._deadline
        if not (completed or cut):
            return False  # aborted for an interactive arrival: it says nothing about speed
        self.steps_cut += cut
        if self._threads == self.current:
            expected = self._expected(self.current)
            ratio = cost / expected if expected is not None else 1.0
            self._record(self.current, cost)
            if ratio >= GOVERNOR_SEVERE_STALL:  # a cut step's cost is a lower bound: enough to act on
                self._slowdown, self._stalls = ratio, GOVERNOR_STALLS_BEFORE_PROBE
            else:
                self._stalls = self._stalls + 1 if ratio >= GOVERNOR_STALL else 0
        else:
            self._judge_probe(self._threads, cost)  # an aborted probe's cost is a lower bound
        return cut

    # ---- decisions ------------------------------------------------------------------------------
    def _expected(self, threads: int) -> float | None:
        recent = self._recent.get((threads, self._shape))
        return statistics.median(recent) if recent and len(recent) == GOVERNOR_RECENT else None

    def _record(self, threads: int, cost: float) -> None:
        self._recent.setdefault((threads, self._shape), deque(maxlen=GOVERNOR_RECENT)).append(cost)

    def _due_probe(self, step_s: float) -> int | None:
        now = self._clock()
        urgent = self._stalls >= GOVERNOR_STALLS_BEFORE_PROBE
        long_prompt_step = not self._shape[0] and step_s > GOVERNOR_QUICK_STEP_S
        every = max(self._probe_every, GOVERNOR_LONG_STEPS_PROBE_S) if long_prompt_step else self._probe_every
        stale = [t for t in self.candidates if t != self.current
                 and (urgent or now - self._probed_at.get(t, self._started) >= every)]
        # The nearest count first: one step away from what works.
        return min(stale, key=lambda t: abs(t - self.current), default=None)

    def _judge_probe(self, threads: int, cost: float) -> None:
        # After a severe stall the current count's medians still describe the time before it.
        expected = self._expected(self.current)
        expected = None if expected is None else expected * self._slowdown
        self._probed_at[threads] = self._clock()
        self._stalls, self._slowdown = 0, 1.0
        if expected is not None and cost * GOVERNOR_SWITCH_MARGIN < expected:
            log.info("decode threads %d -> %d: %.2f ms against %.2f ms per unit of work",
                     self.current, threads, 1e3 * cost, 1e3 * expected)
            # What the new count cost before describes other conditions: start its record afresh.
            self._recent = {key: costs for key, costs in self._recent.items() if key[0] != threads}
            self._record(threads, cost)
            self.current = threads
            self.switches += 1
            self._probe_every = GOVERNOR_FIRST_PROBE_S  # conditions changed: look again soon
        else:  # the probe confirmed the current count
            longest = GOVERNOR_MAX_PROBE_S if self.current == self.max_threads else GOVERNOR_MAX_PROBE_UP_S
            self._probe_every = min(longest, self._probe_every * 2)


class _Watchdog:
    """One daemon thread that interrupts the decode in flight once its deadline passes.

    Waking it costs a core that ggml's threads are using mid-decode, so it is woken only when it
    would otherwise sleep past the new deadline; else it re-reads the deadline when it wakes."""

    def __init__(self, interrupter: Interrupter) -> None:
        self._interrupter = interrupter
        self._wake = threading.Condition()
        self._due: float | None = None  # time.monotonic() of the armed deadline
        self._sleeps_until: float | None = None  # when the thread wakes by itself; None: idle
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> None:
        with self._wake:
            self._due = time.monotonic() + seconds
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cobatch-step-watchdog", daemon=True)
                self._thread.start()
            elif self._sleeps_until is None or self._sleeps_until > self._due:
                self._wake.notify()

    def disarm(self) -> None:
        with self._wake:
            self._due = None  # under the lock: a deadline passing now can no longer fire

    def _run(self) -> None:
        with self._wake:
            while True:
                if self._due is None:
                    self._sleeps_until = None
                    # An engine that stopped stepping (or was dropped) must not keep a thread.
                    if not self._wake.wait(GOVERNOR_WATCHDOG_IDLE_S) and self._due is None:
                        self._thread = None
                        return
                    continue
                left = self._due - time.monotonic()
                if left > 0:
                    self._sleeps_until = self._due
                    self._wake.wait(left)
                    continue
                self._due = None
                self._interrupter.interrupt()
