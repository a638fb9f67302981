"""Where client threads hand requests to the engine thread, and the registry of live requests.

Thread-safe. The registry answers what must be exact across threads: request ids unique among
live requests, per-tier queue bounds (counting requests still in transit), and the drain.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Any, Callable

from engine.request import EngineClosedError, Priority, RequestError
from engine.sequence import Sequence
from sampling.params import InvalidParameterError


class QueueFullError(RequestError):
    pass


class Inbox:
    def __init__(self, bounds: dict[Priority, int], waiting_in: Callable[[Priority], int]) -> None:
        self._bounds = bounds
        self._waiting_in = waiting_in  # the scheduler's queue lengths
        self._cond = threading.Condition()
        self._messages: collections.deque[tuple[str, Any]] = collections.deque()
        self._live: dict[str, Sequence] = {}
        self._accepting = True

    # ---- client threads -----------------------------------------------------------------------
    def submit(self, sequences: list[Sequence]) -> None:
        """All are accepted, or none is."""
        with self._cond:
            if not self._accepting:
                raise EngineClosedError("the engine is shutting down")
            ids = [s.request_id for s in sequences]
            if len(set(ids)) < len(ids) or any(i in self._live for i in ids):
                raise InvalidParameterError("request ids must be unique among live requests", field="request_id")
            queued = self._queued()
            for tier, bound in self._bounds.items():
                adding = sum(1 for s in sequences if s.request.priority is tier)
                if adding and queued[tier] + adding > bound:
                    raise QueueFullError(f"the {tier.value} queue is full: {bound} requests are already waiting")
            for seq in sequences:
                self._live[seq.request_id] = seq
            self._messages.append(("submit", sequences))

    def cancel(self, request_id: str) -> None:
        with self._cond:
            self._messages.append(("cancel", request_id))

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._messages.append(("call", (fn, future)))
        return future

    def close(self) -> None:
        with self._cond:
            self._accepting = False

    def wait_until_empty(self, timeout: float) -> list[str]:
        """Wait up to timeout seconds for every live request to finish; the ids still live."""
        with self._cond:
            self._cond.wait_for(lambda: not self._live, max(0.0, timeout))
            return list(self._live)

    @property
    def n_live(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._messages)

    # ---- engine thread ------------------------------------------------------------------------
    def take(self, admit: Callable[[Sequence], None]) -> list[tuple[str, Any]]:
        """Hand submitted sequences to `admit` (under the lock, so queue bounds never miss them
        in transit); return the other messages, cancellations resolved to their sequences."""
        rest: list[tuple[str, Any]] = []
        with self._cond:
            while self._messages:
                kind, payload = self._messages.popleft()
                if kind == "submit":
                    for seq in payload:
                        if seq.finish_reason is None:
                            admit(seq)
                elif kind == "cancel":
                    seq = self._live.get(payload)
                    if seq is not None:
                        rest.append((kind, seq))
                else:
                    rest.append((kind, payload))
        return rest

    def finished(self, seq: Sequence) -> None:
        with self._cond:
            self._live.pop(seq.request_id, None)
            self._cond.notify_all()

    def live_sequences(self) -> list[Sequence]:
        with self._cond:
            return list(self._live.values())

    def _queued(self) -> dict[Priority, int]:
        queued = {p: self._waiting_in(p) for p in Priority}
        for kind, payload in self._messages:
            if kind == "submit":
                for seq in payload:
                    queued[seq.request.priority] += 1
        return queued
