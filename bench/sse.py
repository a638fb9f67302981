"""Decoding Server-Sent Events line by line, shared by the HTTP benchmark and the tests."""
from __future__ import annotations

from typing import Iterable, Iterator

Event = tuple[str | None, str]  # (event name, data)


class SseDecoder:
    """Feed it the stream's lines; it returns each event when the blank line closing it
    arrives. llama.cpp's `error: {...}` lines come out as ("error", data)."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> Event | None:
        if line == "":
            return self.flush()
        if line.startswith("event:"):
            self._event = line[len("event:"):].strip()
        elif line.startswith("data:"):
            self._data.append(line[len("data:"):].lstrip(" "))
        elif line.startswith("error:"):
            return "error", line[len("error:"):].strip()
        return None

    def flush(self) -> Event | None:
        """The event still open at the end of the stream, if it has data."""
        event, data = self._event, self._data
        self._event, self._data = None, []
        return (event, "\n".join(data)) if data else None


def sse_events(lines: Iterable[str]) -> Iterator[Event]:
    """(event name, data) pairs from an SSE line stream."""
    decoder = SseDecoder()
    for line in lines:
        if (event := decoder.feed(line)) is not None:
            yield event
    if (event := decoder.flush()) is not None:
        yield event
