"""The server's lifecycle around one engine: loading → ok → draining → stopped (or failed).

The model loads on a background thread so the HTTP server answers (503 "loading") at once.
Every generation request is admitted through `admit()`, which refuses with 503 unless the
engine is ready, and counts the request in flight so shutdown can wait for it.
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from engine import RequestHandle
from server.chat_format import ChatFormatter
from server.chat_setup import chat_formatter_for
from server.engine_protocol import ServedEngine
from server.errors import ServiceUnavailable

log = logging.getLogger("cobatch.server")

LOADING, OK, FAILED, DRAINING, STOPPED = "loading", "ok", "failed", "draining", "stopped"

# The directories of an absolute or home path ("/home/me/models/" of "/home/me/models/x.gguf"),
# not of a URL.
_DIRECTORIES = re.compile(r"(?<![\w:/.~])~?/(?:[^/\s'\"]+/)+")


def without_directories(text: str) -> str:
    """`text` with absolute paths cut to their file names: what /health may show of an error
    (the log keeps the whole message)."""
    return _DIRECTORIES.sub("", text)


@dataclass(frozen=True)
class ModelInfo:
    model_id: str  # what /v1/models lists and the `model` field must name
    description: str
    file_name: str  # never the path: /health is open to anyone who reaches the port
    chat_style: str

    def accepts_name(self, name: str) -> bool:
        return name in (self.model_id, self.file_name, self.description)


class ServingState:
    def __init__(
        self,
        loader: Callable[[], ServedEngine],
        *,
        owns_engine: bool,
        drain_timeout: float,
        cancel_backstop: float,
        model_id: str | None = None,
        on_load_failure: Callable[[BaseException], None] | None = None,
        tool_format: str = "auto",
    ) -> None:
        """`tool_format`: `--tool-format` (server/chat_setup.py)."""
        self._loader = loader
        self._tool_format = tool_format
        self._owns_engine = owns_engine
        self.drain_timeout = drain_timeout
        self._cancel_backstop = cancel_backstop  # server.context.CANCEL_BACKSTOP_S
        self._model_id_override = model_id
        self._on_load_failure = on_load_failure
        self.status = LOADING
        self.error: str | None = None
        self.engine: ServedEngine | None = None
        self.model: ModelInfo | None = None
        self.chat: ChatFormatter | None = None
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self._lock = threading.Condition()
        self._admitting = 0  # requests between admission and submit (or refusal)
        self._handles: set[RequestHandle] = set()
        self._cancelling = False
        self._load_thread: threading.Thread | None = None
        self._drain_thread: threading.Thread | None = None

    # ---- loading ----------------------------------------------------------------------------
    def start_loading(self) -> None:
        if self._load_thread is None:
            self._load_thread = threading.Thread(target=self._load, name="cobatch-model-load", daemon=True)
            self._load_thread.start()

    def _load(self) -> None:
        try:
            engine = self._loader()
            model = engine.model
            chat = chat_formatter_for(model, self._tool_format)
            info = ModelInfo(
                model_id=self._model_id_override or Path(str(model.path)).stem,
                description=model.description,
                file_name=Path(str(model.path)).name,
                chat_style=chat.style,
            )
        except BaseException as exc:  # a bad path or file must show on /health, not vanish
            log.exception("model load failed")
            with self._lock:
                self.status, self.error = FAILED, without_directories(f"{type(exc).__name__}: {exc}")
            if self._on_load_failure is not None:
                self._on_load_failure(exc)
            return
        with self._lock:
            self.engine, self.model, self.chat = engine, info, chat
            if self.status == LOADING:
                self.status = OK
                log.info("model %s ready (chat style %s)", info.model_id, chat.style)
                return
        # Shutdown began while loading: nobody will use this engine.
        if self._owns_engine:
            engine.close()

    # ---- admission --------------------------------------------------------------------------
    @contextlib.contextmanager
    def admit(self) -> Iterator[ServedEngine]:
        """Yields the engine for one request, or raises 503 while loading, failed or draining."""
        with self._lock:
            if self.status != OK:
                raise self.unavailable()
            self._admitting += 1
        try:
            yield self.engine
        finally:
            with self._lock:
                self._admitting -= 1
                self._lock.notify_all()

    def unavailable(self) -> ServiceUnavailable:
        reason = {
            LOADING: "the model is still loading; retry shortly",
            FAILED: f"the model failed to load: {self.error}",
            DRAINING: "the server is shutting down and accepts no new requests",
            STOPPED: "the server has shut down",
        }.get(self.status, f"the server is {self.status}")
        headers = {"Retry-After": "2"} if self.status == LOADING else {}
        return ServiceUnavailable(reason, code=self.status, headers=headers)

    def track(self, handle: RequestHandle) -> None:
        """Follow a submitted request until `untrack` (when it has finished)."""
        with self._lock:
            self._handles.add(handle)
            cancel = self._cancelling
        if cancel:  # submitted after the drain deadline swept the others
            handle.cancel()

    def untrack(self, handle: RequestHandle) -> None:
        with self._lock:
            self._handles.discard(handle)
            self._lock.notify_all()

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet finished, plus any being admitted right now."""
        return self._admitting + len(self._handles)

    # ---- shutdown ---------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """Stop admitting now; running requests get drain_timeout seconds, then are cancelled.
        Safe to call from a signal handler and more than once."""
        with self._lock:
            if self._drain_thread is not None:
                return
            if self.status in (LOADING, OK):
                self.status = DRAINING
            self._drain_thread = threading.Thread(target=self._drain, name="cobatch-drain", daemon=True)
        self._drain_thread.start()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        self.begin_shutdown()
        assert self._drain_thread is not None
        self._drain_thread.join(timeout)
        return not self._drain_thread.is_alive()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        with self._lock:
            self._lock.wait_for(lambda: self.in_flight == 0, max(0.0, deadline - time.monotonic()))
            self._cancelling = True
            left = list(self._handles)
        if left:
            log.warning("drain timeout: cancelling %d running request(s)", len(left))
        for handle in left:
            handle.cancel()
        with self._lock:
            # Cancelled requests answer within an engine step; don't hang forever on a bug.
            self._lock.wait_for(lambda: self.in_flight == 0, self._cancel_backstop)
        engine = self.engine
        if self._owns_engine and engine is not None:
            engine.close(drain_timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self.status != FAILED:
                self.status = STOPPED
        log.info("drained; engine %s", "closed" if self._owns_engine else "left open")
