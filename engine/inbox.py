"""Where client threads hand requests to the engine thread, and the registry of live requests.

Thread-safe: every method takes its lock. The registry answers what must be exact across
threads: request ids unique among live requests, per-tier queue bounds, and the drain. Queue
lengths come from the engine's published stats, never from the scheduler itself: a bound counts
the queue as last published, plus what the engine took from here since, plus what is in transit.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from engine.ownership import claim
from engine.request import Priority
from engine.sequence import Sequence
from engine.stats import EngineStats, StatsBoard
from engine.errors import EngineClosedError, QueueFullError
from sampling.errors import InvalidParameterError


# ---- what client threads send ---------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    sequences: tuple[Sequence, ...]  # admitted together, or none of them


@dataclass(frozen=True)
class Adopt:
    """A sequence back from the first-token lane (engine/first_token_lane.py)."""

    sequence: Sequence
    cells: bytes | None  # its prompt's KV cells; None: compute them here
    reason: Any  # FinishReason if its first token ended it
    error: str | None = None


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class Call:
    """A function to run on the engine thread between two steps; its outcome goes to `future`."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except Exception as exc:
            self.future.set_exception(exc)


Message = Union[Submit, Adopt, Cancel, Call]


# ---- what the engine thread gets back from take() -------------------------------------------
@dataclass(frozen=True)
class CancelLive:
    """A Cancel whose request was still live when taken: its sequence, to finish."""

    sequence: Sequence


class Inbox:
    def __init__(self, bounds: dict[Priority, int], board: StatsBoard) -> None:
        self._bounds = bounds
        self._cond = threading.Condition()
        self._waiting = {p: 0 for p in Priority}  # the scheduler's queues as last published
        self._taken = {p: 0 for p in Priority}  # handed to the engine thread since that publish
        board.listen(self._published)
        self._messages: collections.deque[Message] = collections.deque()
        self._live: dict[str, Sequence] = {}
        self._elsewhere: set[str] = set()  # live requests the first-token lane holds
        self._accepting = True

    # ---- client threads -----------------------------------------------------------------------
    def submit(self, sequences: list[Sequence], to_lane: Sequence | None = None) -> None:
        """All are accepted, or none is. `to_lane` (one of them) goes to the first-token lane
        instead: it is live, and reaches the engine thread when the lane hands it over."""
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
            if to_lane is not None:
                self._elsewhere.add(to_lane.request_id)
            rest = tuple(s for s in sequences if s is not to_lane)
            if rest:
                self._messages.append(Submit(rest))

    def hand_over(self, seq: Sequence, cells: bytes | None, reason: Any, error: str | None = None) -> None:
        """The first-token lane is done with `seq` (its thread calls this)."""
        with self._cond:
            self._elsewhere.discard(seq.request_id)
            # Ahead of everything queued: a cancel for it that waited must find it adopted.
            self._messages.appendleft(Adopt(seq, cells, reason, error))

    def cancel(self, request_id: str) -> None:
        with self._cond:
            self._messages.append(Cancel(request_id))

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        message = Call(fn)
        with self._cond:
            self._messages.append(message)
        return message.future

    def close(self) -> None:
        with self._cond:
            self._accepting = False

    def wait_until_empty(self, timeout: float) -> list[str]:
        """Wait up to timeout seconds for every live request to finish; the ids still live."""
        with self._cond:
            self._cond.wait_for(lambda: not self._live, max(0.0, timeout))
            return list(self._live)

    def is_idle(self) -> bool:
        """No live request: nothing queued, running, in transit or in the first-token lane."""
        with self._cond:
            return not self._live

    # ---- engine thread ------------------------------------------------------------------------
    def take(self, admit: Callable[[Sequence], None]) -> list[CancelLive | Adopt | Call]:
        """Hand submitted sequences to `admit` (under the lock, so queue bounds never miss them
        in transit); return the rest in arrival order, cancellations resolved to their live
        sequences (a cancel for a request already gone is dropped; one for a request the lane
        holds waits until the lane hands it over)."""
        rest: list[CancelLive | Adopt | Call] = []
        later: list[Message] = []
        with self._cond:
            while self._messages:
                message = self._messages.popleft()
                if isinstance(message, Submit):
                    for seq in message.sequences:
                        claim(seq)  # the engine thread holds it from here on
                        if seq.finish_reason is None:
                            self._taken[seq.request.priority] += 1
                            admit(seq)
                elif isinstance(message, Cancel):
                    if message.request_id in self._elsewhere:
                        later.append(message)
                    elif (seq := self._live.get(message.request_id)) is not None:
                        rest.append(CancelLive(seq))
                else:
                    if isinstance(message, Adopt):
                        claim(message.sequence)  # back from the lane's thread
                    rest.append(message)
            self._messages.extend(later)
        return rest

    def finished(self, seq: Sequence) -> None:
        with self._cond:
            self._live.pop(seq.request_id, None)
            self._cond.notify_all()

    def live_sequences(self) -> list[Sequence]:
        with self._cond:
            return list(self._live.values())

    def _published(self, stats: EngineStats) -> None:
        """The engine thread published its queues: everything it took before is in them."""
        with self._cond:
            self._waiting = {p: stats.tiers[p.value].waiting for p in Priority}
            self._taken = {p: 0 for p in Priority}

    def _queued(self) -> dict[Priority, int]:
        queued = {p: self._waiting[p] + self._taken[p] for p in Priority}
        for message in self._messages:
            if isinstance(message, Submit):
                for seq in message.sequences:
                    queued[seq.request.priority] += 1
        return queued
