"""uvicorn.Server that starts the app's drain the moment a shutdown signal arrives."""
from __future__ import annotations

import signal
from types import FrameType
from typing import Callable

import uvicorn


class DrainingServer(uvicorn.Server):
    """On SIGINT/SIGTERM uvicorn stops listening and waits for open connections; calling
    `on_signal` first stops the batch job runner sending, makes requests still arriving on those
    connections get 503, and starts the bounded wait after which running requests are cancelled.

    uvicorn's own handler also records the signal and re-raises it once shutdown is done, so
    the process would die of SIGTERM (or raise KeyboardInterrupt) after draining perfectly well.
    A drained shutdown is a clean exit, so this handler does not record it and `serve` returns 0.
    A second SIGINT still forces an immediate exit, as in uvicorn.
    """

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_signal()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True
