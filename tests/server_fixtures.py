"""Shared helpers for the server tests: a real uvicorn server on a background thread, a small
real engine, and checks that the engine is idle with every KV sequence freed."""
from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from bench.sse import sse_events
from engine import Engine
from engine.model_source import default_model_path
from server.app import create_app
from server.context import ServerSettings

# Without speculative decoding, like the shared engine of tests/conftest.py: draft rows change a
# step's shape and earlier requests' outputs propose drafts, so a request's greedy tokens could
# depend on what other tests sent before (tests/test_speculation_model.py tests it).
SMALL_ENGINE = dict(n_ctx=4096, max_running=16, step_token_budget=256, speculative=False)


def make_engine(**overrides: Any) -> Engine:
    return Engine(default_model_path(), **{**SMALL_ENGINE, **overrides})


_shared: list[Engine] = []


def shared_engine() -> Engine:
    """One SMALL_ENGINE for every test module that leaves it idle, loaded once per process
    (loading takes seconds on 2 busy cores); closed at exit."""
    if not _shared:
        _shared.append(make_engine())
        atexit.register(_shared[0].close)
    return _shared[0]


class LiveServer:
    """uvicorn serving an app on 127.0.0.1 (a free port) from a daemon thread."""

    def __init__(self, app: Any, engine: Engine | None = None, graceful_timeout: int = 30) -> None:
        self.app = app
        self.engine = engine
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, lifespan="on", log_level="warning", timeout_graceful_shutdown=graceful_timeout
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def ctx(self) -> Any:
        return self.app.state.ctx

    def start(self) -> "LiveServer":
        self._thread.start()
        wait_until(lambda: self.server.started, 30, "uvicorn did not start")
        return self

    def stop(self, timeout: float = 60) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def wait_ready(self, timeout: float = 120) -> None:
        wait_until(lambda: self.ctx.state.status == "ok", timeout, "model did not load")


@contextlib.contextmanager
def running_server(
    loader: Callable[[], Any],
    engine: Engine | None = None,
    *,
    wait_ready: bool = True,
    **settings: Any,
) -> Iterator[LiveServer]:
    """An app on a shared engine: the app does not close it (the fixture that made it does)."""
    options = {"owns_engine": False, "drain_timeout": 10.0, **settings}
    server = LiveServer(create_app(loader, ServerSettings(**options)), engine).start()
    try:
        if wait_ready:
            server.wait_ready()
        yield server
    finally:
        server.stop()


def wait_until(predicate: Callable[[], Any], timeout: float, message: str = "condition not met") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} within {timeout} s")
        time.sleep(0.01)


def kv_positions(engine: Engine) -> list[int]:
    """seq_pos_max of every sequence id, read on the engine thread (-1: holds no KV)."""
    n = engine.config.max_running
    return engine.inspect(lambda runner: [runner.context.seq_pos_max(i) for i in range(n)])


def is_idle(engine: Engine) -> bool:
    s = engine.stats()
    return s.running == 0 and sum(s.waiting.values()) == 0 and s.kv_cells_used == 0


def assert_engine_idle(engine: Engine, timeout: float = 15.0) -> None:
    """Nothing running or queued, no KV cells counted, and llama.cpp holds no position for
    any sequence id: whatever ran before left no seq id or KV behind."""
    wait_until(lambda: is_idle(engine), timeout, f"engine not idle: {engine.stats()}")
    assert kv_positions(engine) == [-1] * engine.config.max_running


def generate_stream(client: httpx.Client, body: dict) -> list[tuple[str | None, Any]]:
    with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return [(name, json.loads(data)) for name, data in sse_events(response.iter_lines())]


def scrape(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def raw_http_request(port: int, path: str, body: dict) -> socket.socket:
    """Send a POST by hand and return the open socket, so a test can hang up at a chosen moment."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
    )
    return sock


# Asks for the product-review schema of bench/schemas.py (max_tokens ~40 is enough).
REVIEW_PROMPT = "Review of the Acme kettle as JSON with rating, pros, cons and summary:\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_serve(*args: str, launcher: tuple[str, ...] = ("-m", "server.cli"), log: Path | None = None,
                port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start `cobatch serve ARGS` (through `launcher`, a module that ends in server.cli's main) on a
    free port; its output goes to `log`, or to a pipe. Returns the process and its base URL."""
    port = port or free_port()
    out = subprocess.PIPE if log is None else open(log, "a")
    proc = subprocess.Popen(
        [sys.executable, *launcher, "serve", "--port", str(port), "--log-level", "warning", *args],
        cwd=Path(__file__).resolve().parents[1], stdout=out, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if log is not None:
        out.close()
    else:
        _drain(proc)
    return proc, f"http://127.0.0.1:{port}"


def _drain(proc: subprocess.Popen) -> None:
    """Read the server's output as it comes, keeping its last lines (proc.output_tail): a pipe
    nobody reads fills at 64 KB, and the server's next log line then blocks it (a store failing
    many times logs that much), which looks like a hung server."""
    tail: collections.deque[str] = collections.deque(maxlen=200)
    proc.output_tail = tail  # type: ignore[attr-defined]

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            tail.append(line)

    reader = threading.Thread(target=read, daemon=True, name=f"serve-{proc.pid}-output")
    reader.start()
    proc.output_reader = reader  # type: ignore[attr-defined]


def output_of(proc: subprocess.Popen) -> str:
    """The last lines a spawned server wrote (all of them when it wrote to a log file: read that)."""
    reader = getattr(proc, "output_reader", None)
    if reader is not None and proc.poll() is not None:
        reader.join(5)  # the pipe ends with the process: the last lines are in
    return "".join(getattr(proc, "output_tail", ())) or f"exited {proc.returncode}"


def wait_serving(proc: subprocess.Popen, url: str, timeout: float = 180) -> None:
    """Until /health says ok; fails at once if the process ends first."""
    def ready() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, output_of(proc)
            return False

    wait_until(ready, timeout, "cobatch serve did not become ready")


@contextlib.contextmanager
def serve_process(*args: str, timeout: float = 180, launcher: tuple[str, ...] = ("-m", "server.cli"),
                  log: Path | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """`cobatch serve ARGS` in a child process on a free port, once /health says ok; killed at
    the end if the test left it running. Yields the process and its base URL."""
    proc, url = spawn_serve(*args, launcher=launcher, log=log)
    try:
        wait_serving(proc, url, timeout)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
