"""The engine thread: the only thread that touches the core (llama.cpp is not thread-safe).

Each turn: take what clients sent (requests, cancellations, calls), expire deadlines, run one
core step, publish the stats and wake the clients' event loops. It sleeps only when there is
nothing it can do.
"""
from __future__ import annotations

import threading
import time

from engine.core import EngineCore
from engine.handle import LoopWaker
from engine.inbox import Adopt, CancelLive, Inbox
from engine.request import FinishReason
from engine.sequence import Sequence

_IDLE_WAIT_S = 0.05
# Backstop for the drain: a cancellation is answered within one step, so this wait ends long
# before it unless the engine thread is stuck.
_CANCELS_ANSWERED_BACKSTOP_S = 30.0


class EngineLoop:
    def __init__(self, core: EngineCore, inbox: Inbox, waker: LoopWaker) -> None:
        self.core = core
        self.inbox = inbox
        self._waker = waker
        self._with_deadline: set[Sequence] = set()
        self._wakeup = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="cobatch-engine", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wakeup.set()

    def drain(self, timeout: float) -> None:
        """Refuse new requests; give live ones up to `timeout` seconds, then cancel the rest and
        wait until each has answered."""
        self.inbox.close()
        left = self.inbox.wait_until_empty(timeout)
        for request_id in left:
            self.inbox.cancel(request_id)
        self.wake()
        if left and self._thread.is_alive():
            self.inbox.wait_until_empty(_CANCELS_ANSWERED_BACKSTOP_S)

    def stop(self) -> None:
        """End the thread; requests still live are cancelled."""
        self.inbox.close()
        self._stopping = True
        self.wake()
        self._thread.join()

    def is_idle(self) -> bool:
        return not self.inbox and not self.core.has_work()

    def _run(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            self._take_inbox()
            self._expire_deadlines()
            worked = False
            if self.core.has_work():
                try:
                    worked = self.core.step()  # False: waiting requests none of which can start yet
                except Exception as exc:  # a bug must fail requests, not kill the engine thread
                    self.core.fail_running(exc)
                    worked = True
            self.core.publish_stats()
            self._waker.flush()  # one wake-up per event loop for everything this turn published
            if not worked:
                self._wakeup.wait(_IDLE_WAIT_S)
        self._take_inbox()
        for seq in self.inbox.live_sequences():
            self.core.finish(seq, FinishReason.CANCELLED, error="the engine shut down")
        self.core.publish_stats()
        self._waker.flush()

    def _admit(self, seq: Sequence) -> None:
        self.core.add(seq)
        if seq.deadline is not None:
            self._with_deadline.add(seq)

    def _take_inbox(self) -> None:
        for message in self.inbox.take(self._admit):
            if isinstance(message, CancelLive):
                if message.sequence.finish_reason is None:
                    self.core.finish(message.sequence, FinishReason.CANCELLED)
            elif isinstance(message, Adopt):
                self.core.adopt(message.sequence, message.cells, message.reason, message.error)
                if message.sequence.deadline is not None and message.sequence.finish_reason is None:
                    self._with_deadline.add(message.sequence)
            else:
                message.run()

    def _expire_deadlines(self) -> None:
        if not self._with_deadline:
            return
        now = time.perf_counter()
        for seq in [s for s in self._with_deadline if s.finish_reason is not None or s.deadline <= now]:
            self._with_deadline.discard(seq)
            if seq.finish_reason is None:
                self.core.finish(seq, FinishReason.TIMEOUT, error=f"its timeout of {seq.request.timeout:g} s passed")
