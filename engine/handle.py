"""The client's view of one submitted request: stream deltas, await the result, cancel."""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import AsyncIterator, Callable, Iterator

from engine.request import GenerationResult

log = logging.getLogger(__name__)


class LoopWaker:
    """Wakes each asyncio loop once per engine step, however many of its streams got text.

    A server streaming to 16 clients would otherwise get 16 cross-thread wake-ups per step,
    each a write to the loop's self-pipe and a callback competing with the engine for the GIL.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, set[asyncio.Event]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        with self._lock:
            self._pending.setdefault(loop, set()).add(event)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, events in pending.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_set_all, events)


def _call(callback: Callable[[GenerationResult], None], result: GenerationResult) -> None:
    try:
        callback(result)
    except Exception:  # the engine thread publishes: a consumer's bug must not end it
        log.exception("a result callback of %s failed", result.request_id)


def _set_all(events: set[asyncio.Event]) -> None:
    for event in events:
        event.set()


class RequestHandle:
    """Thread-safe: the engine thread publishes, any thread or event loop consumes."""

    def __init__(self, request_id: str, prompt_tokens: int, canceller: Callable[[str], None],
                 waker: LoopWaker | None = None) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._canceller = canceller
        self._waker = waker  # None: wake event loops at once
        self._cond = threading.Condition()
        self._deltas: list[str] = []
        self._result: GenerationResult | None = None
        self._ending: GenerationResult | None = None  # the result, from the moment it is published
        self._on_result: list[Callable[[GenerationResult], None]] = []
        self._loop_events: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # Engine side.
    def publish_delta(self, text: str) -> None:
        if text:
            with self._cond:
                self._deltas.append(text)
                self._wake()

    def publish_result(self, result: GenerationResult) -> None:
        with self._cond:
            if self._ending is not None:
                return
            self._ending = result
            callbacks, self._on_result = self._on_result, []
        for callback in callbacks:  # before any consumer can see the result: see on_result
            _call(callback, result)
        with self._cond:
            self._result = result
            self._wake()

    def on_result(self, callback: Callable[[GenerationResult], None]) -> None:
        """`callback(result)` on the publishing thread before any consumer can see the result (at
        once on this thread if it is already published), so what must be settled before a client
        can learn its request has ended, such as its tenant's place in flight, is settled first."""
        with self._cond:
            ending = self._ending
            if ending is None:
                self._on_result.append(callback)
                return
        _call(callback, ending)

    # Client side.
    def cancel(self) -> None:
        """Stop generating; the result arrives with finish_reason 'cancelled' (or the real one if it
        finished first). Safe to call at any stage and more than once."""
        if not self.done():
            self._canceller(self.request_id)

    def streamed_text(self) -> str:
        """All text deltas published so far, joined."""
        with self._cond:
            return "".join(self._deltas)

    def done(self) -> bool:
        return self._result is not None

    def result(self, timeout: float | None = None) -> GenerationResult:
        with self._cond:
            if not self._cond.wait_for(lambda: self._result is not None, timeout):
                raise TimeoutError(f"{self.request_id} did not finish within {timeout} s")
            assert self._result is not None
            return self._result

    def stream(self) -> Iterator[str]:
        """Blocking iterator over text deltas."""
        seen = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: len(self._deltas) > seen or self._result is not None)
                fresh, finished = self._deltas[seen:], self._result is not None
            seen += len(fresh)
            yield from fresh
            if finished and seen == len(self._deltas):
                return

    def __await__(self):
        return self._await_result().__await__()

    async def _await_result(self) -> GenerationResult:
        async for _ in self._iterate():
            pass
        assert self._result is not None
        return self._result

    def __aiter__(self) -> AsyncIterator[str]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with self._cond:
            self._loop_events.append((loop, event))
        seen = 0
        try:
            while True:
                with self._cond:
                    fresh, finished = self._deltas[seen:], self._result is not None
                    if not fresh and not finished:
                        event.clear()
                if fresh:
                    seen += len(fresh)
                    for delta in fresh:
                        yield delta
                    continue
                if finished:
                    return
                await event.wait()
        finally:
            with self._cond:
                self._loop_events.remove((loop, event))

    def _wake(self) -> None:
        self._cond.notify_all()
        for loop, event in self._loop_events:
            if self._waker is not None:
                self._waker.add(loop, event)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(event.set)
