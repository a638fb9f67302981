"""The engine thread: the only thread that touches the core (llama.cpp is not thread-safe).

Each turn: take what clients sent (requests, cancellations, calls), expire deadlines, run one
core step, publish the stats and wake the clients' event loops. It sleeps only when there is
nothing it can do. A failure in any part of a turn fails the requests it concerns, with the
reason, and the thread goes on serving the others: it never ends while the engine is open.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

from engine.core import EngineCore
from engine.handle import LoopWaker
from engine.inbox import Adopt, CancelLive, Inbox
from engine.request import FinishReason
from engine.sequence import Sequence
from engine.tuning import CANCELS_ANSWERED_BACKSTOP_S, IDLE_WAIT_S

log = logging.getLogger("cobatch.engine")


class EngineLoop:
    def __init__(self, core: EngineCore, inbox: Inbox, wakeup: threading.Event, waker: LoopWaker,
                 nice: int = 0) -> None:
        self.core = core
        self._nice = nice
        self.inbox = inbox
        self._wakeup = wakeup  # set by anyone with work for this thread
        self._waker = waker
        self._with_deadline: set[Sequence] = set()  # engine thread only
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
            self.inbox.wait_until_empty(CANCELS_ANSWERED_BACKSTOP_S)

    def stop(self) -> None:
        """End the thread; requests still live are cancelled."""
        self.inbox.close()
        self._stopping = True
        self.wake()
        self._thread.join()

    # ---- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        _lower_this_thread(self._nice)  # first: the ggml threads it starts inherit it
        self.core.claim_for_this_thread()
        while not self._stopping:
            self._wakeup.clear()
            if not self._turn():
                self._wakeup.wait(IDLE_WAIT_S)
        self._guarded("taking the inbox", self._take_inbox)
        for seq in self.inbox.live_sequences():
            self._guarded("cancelling at shutdown", self.core.finish, seq, FinishReason.CANCELLED,
                          "the engine shut down")
        self._publish()

    def _turn(self) -> bool:
        """One turn; False when there was nothing to do."""
        worked = False
        try:
            self._take_inbox()
            self._expire_deadlines()
            if self.core.has_work():
                worked = self.core.step()  # False: waiting requests none of which can start yet
        except Exception as exc:  # a bug must fail requests, not kill the engine thread
            log.exception("engine turn failed")
            self.core.fail_running(exc)
            worked = True
        self._publish()
        return worked

    def _publish(self) -> None:
        self.core.publish_stats()  # never raises: readers keep the last snapshot
        # One wake-up per event loop for everything this turn published.
        self._guarded("waking event loops", self._waker.flush)

    def _guarded(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("engine loop: %s failed", what)

    def _admit(self, seq: Sequence) -> None:
        try:
            self.core.add(seq)
        except Exception as exc:  # this request only: the others in the inbox still go in
            log.exception("admitting %s failed", seq.request_id)
            self._fail(seq, exc)
            return
        if seq.deadline is not None:
            self._with_deadline.add(seq)

    def _take_inbox(self) -> None:
        # Taken messages are off the inbox: each is handled on its own, so one failure loses
        # none of the others (an adoption lost here would leave its client waiting for ever).
        for message in self.inbox.take(self._admit):
            if isinstance(message, CancelLive):
                if message.sequence.finish_reason is None:
                    self._guarded("cancelling", self.core.finish, message.sequence, FinishReason.CANCELLED)
            elif isinstance(message, Adopt):
                self._adopt(message)
            else:
                message.run()  # a Call reports its own failure to its caller

    def _adopt(self, message: Adopt) -> None:
        seq = message.sequence
        try:
            self.core.adopt(seq, message.cells, message.reason, message.error)
        except Exception as exc:
            log.exception("adopting %s from the first-token lane failed", seq.request_id)
            self._fail(seq, exc)
            return
        if seq.deadline is not None and seq.finish_reason is None:
            self._with_deadline.add(seq)

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        if seq.finish_reason is None:
            self._guarded("failing a request", self.core.finish, seq, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")

    def _expire_deadlines(self) -> None:
        if not self._with_deadline:
            return
        now = time.perf_counter()
        for seq in [s for s in self._with_deadline if s.finish_reason is not None or s.deadline <= now]:
            self._with_deadline.discard(seq)
            if seq.finish_reason is None:
                self._guarded("expiring a deadline", self.core.finish, seq, FinishReason.TIMEOUT,
                              f"its timeout of {seq.request.timeout:g} s passed")


def _lower_this_thread(increment: int) -> None:
    """Raise the calling thread's nice by `increment` (Linux: nice is per thread, and threads
    inherit it from the thread that starts them). An unprivileged thread can never lower it again."""
    if increment <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except OSError as exc:
        log.warning("the engine thread keeps its priority: %s", exc)
