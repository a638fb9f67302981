"""Noticing a client that hangs up: the ASGI receive channel's `http.disconnect`.

A streamed answer (server/sse.py) and a waited-for one (server/generation.py) both watch for it,
so that a client who leaves has its requests cancelled instead of left running.
"""
from __future__ import annotations

from typing import Awaitable, Callable

Receive = Callable[[], Awaitable[dict]]


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the ASGI server reports the client gone. The body has been read already,
    so the only message still to come is http.disconnect."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
