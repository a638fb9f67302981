"""Whether an arriving interactive request should abort the llama_decode in flight.

Aborting costs the batch work the part of the step already computed, so it is worth it only
early in a step, and only in steps the policy marked interruptible (engine/policy.py says
which). "Early" is a fraction of a typical interruptible step of the same kind (pure decode,
prompt chunks alone, or both: they run for very different times) run with as many threads (the
thread governor's probe at another count runs twice as long), a moving average of their times.
A step with decode rows ends in the output projection of every row, which llama.cpp cannot
abort, so an abort requested late in it lands only when the step is done. A step of prompt
chunks alone has one output row at most: it can be aborted almost to its end, and one of a long
prompt lasts half a second, so the arrival may abort it until `PROMPT_ONLY_INTERRUPT_FRACTION` of it (engine/tuning.py).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from engine.tuning import PROMPT_ONLY_INTERRUPT_FRACTION, TYPICAL_STEP_NEWEST_WEIGHT


class Interrupter(Protocol):
    def interrupt(self) -> None: ...

    def reset(self) -> None: ...


class InterruptWindow:
    """Thread-safe: the engine thread opens and closes it, submitting threads call `arrival`."""

    def __init__(self, interrupter: Interrupter, fraction: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._interrupter = interrupter
        self._fraction = fraction
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False  # the step in flight may still be aborted
        self._interruptible = False  # the step in flight was planned interruptible
        self._started = 0.0
        self._kind: tuple[str, int] = ("decode", 0)
        self._batch_only = False
        self._in_flight = False
        # An arrival between two decodes may come after the engine took its inbox for the next
        # step: that step was planned without it, so it is aborted as soon as it starts.
        self._arrived_between = False
        # Seconds by (step kind, threads), moving average of interruptible steps.
        self.typical_steps: dict[tuple[str, int], float] = {}

    def begin(self, interruptible: bool, kind: str = "decode", threads: int = 0, batch_only: bool = False) -> None:
        """`batch_only`: no interactive sequence is in the step (it waits for the lane)."""
        with self._lock:
            self._interrupter.reset()
            self._open = self._interruptible = interruptible
            self._kind = (kind, threads)
            self._batch_only = batch_only
            self._started = self._clock()
            self._in_flight = True
            # A step planned after the arrival was taken is not interruptible (it carries the
            # arrival's prompt, or has no slot for it), so an interruptible one was planned before.
            if interruptible and self._arrived_between:
                self._interrupter.interrupt()
                self._open = False
            self._arrived_between = False

    def end(self, completed: bool) -> None:
        with self._lock:
            self._open = self._in_flight = False
            self._interrupter.reset()
            if self._interruptible and completed:
                took = self._clock() - self._started
                typical = self.typical_steps.get(self._kind)
                self.typical_steps[self._kind] = took if typical is None else \
                    (1 - TYPICAL_STEP_NEWEST_WEIGHT) * typical + TYPICAL_STEP_NEWEST_WEIGHT * took

    def lane_started(self) -> bool:
        """The first-token lane took an arrival: abort a step of prompt chunks alone in flight,
        however far it is (the lane would share the cores with it, and at depth an abort may
        land only when a long attention node ends, so the lane does not wait for it), or a step
        of batch work alone early in it (batch work waits for the lane: engine/core.py). True if
        one was told to abort."""
        with self._lock:
            if self._open and (self._kind[0] == "prompt" or (self._batch_only and self._young())):
                self._interrupter.interrupt()
                self._open = False
                return True
            return False

    def arrival(self) -> bool:
        """An interactive request was queued; True if the step in flight was told to abort."""
        with self._lock:
            if self._open and self._young():
                self._interrupter.interrupt()
                self._open = False
                return True
            self._arrived_between |= not self._in_flight
            return False

    def _young(self) -> bool:
        typical = self.typical_steps.get(self._kind)
        fraction = max(self._fraction, PROMPT_ONLY_INTERRUPT_FRACTION) if self._kind[0] == "prompt" else self._fraction
        return typical is None or self._clock() - self._started <= fraction * typical
