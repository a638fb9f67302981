"""Server-Sent Events: encoding, and an ASGI response that notices a client hanging up.

Starlette's StreamingResponse stops writing when the client leaves but only tells the body
iterator by cancelling it; here the disconnect is reported at once through `on_disconnect`
(which cancels the engine request), even while the stream is idle waiting for a token.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, AsyncIterator, Callable

from server.errors import APIError, InternalError
from server.hangup import wait_for_disconnect

log = logging.getLogger("cobatch.server")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # tell reverse proxies not to buffer the stream
]


def encode_event(data: Any, event: str | None = None) -> bytes:
    """One SSE event. `data` is JSON-encoded unless it is already a string (e.g. "[DONE]")."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    lines = [f"event: {event}"] if event else []
    # A data field cannot hold a newline; JSON output never does, raw strings are split.
    lines += [f"data: {line}" for line in text.split("\n")]
    return ("\n".join(lines) + "\n\n").encode("utf-8")


class EventStreamResponse:
    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_disconnect: Callable[[], None],
        error_event: Callable[[APIError], bytes],
        headers: dict[str, str] | None = None,
    ) -> None:
        self._events = events
        self._on_disconnect = on_disconnect
        self._error_event = error_event  # how this API reports a failure inside the stream
        self._headers = SSE_HEADERS + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self.client_left = False

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self._headers})
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            async for chunk in self._events:
                if self.client_left:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not self.client_left:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # uvicorn raises ClientDisconnected (an OSError) from send on a dead socket
            self._left()
        except Exception as exc:  # a bug while producing events fails this stream only
            log.exception("event stream failed")
            if not self.client_left:
                error = InternalError(f"internal error while streaming: {type(exc).__name__}: {exc}")
                with contextlib.suppress(OSError):
                    await send({"type": "http.response.body", "body": self._error_event(error), "more_body": False})
        finally:
            watcher.cancel()
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:  # runs the generator's cleanup (cancelling its request) now
                await aclose()

    async def _watch(self, receive: Callable) -> None:
        await wait_for_disconnect(receive)
        self._left()

    def _left(self) -> None:
        if not self.client_left:
            self.client_left = True
            self._on_disconnect()
