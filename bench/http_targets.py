"""HTTP benchmark plumbing shared by http-load, shared-cpu and chat: the servers under test as
targets (one streamed generation, and how to read its answer) and the launchers that start them
(cobatch in this process or in a child process; llama-server lives in bench/peer.py)."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import httpx

from bench.sse import Event, SseDecoder

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9}
# Neutral values sent explicitly: llama.cpp's own defaults are min_p 0.05 (and, in older
# versions, repeat_penalty 1.1), cobatch's are 0 and 1.
NEUTRAL = {"min_p": 0.0}


# ---------------------------------------------------------------------------------------------
# One request


@dataclass
class Sample:
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    tokens: int = 0
    error: str = ""
    text: str = ""  # the answer, as streamed
    final: dict = field(default_factory=dict)  # the last event's payload (usage, timings, metrics)
    gaps_s: list = field(default_factory=list)  # between consecutive events that carried text


async def sse_events(response: httpx.Response) -> AsyncIterator[Event]:
    """(event name, data) pairs of a streamed response (see bench/sse.py)."""
    decoder = SseDecoder()
    async for line in response.aiter_lines():
        if (event := decoder.feed(line)) is not None:
            yield event
    if (event := decoder.flush()) is not None:
        yield event


class Target:
    """A server under test: how to ask it for one streamed generation and read the answer."""

    name = ""

    def __init__(self, url: str, tokens: int, ignore_eos: bool = False) -> None:
        self.url = url.rstrip("/")
        self.tokens = tokens
        self.ignore_eos = ignore_eos

    def request(self, prompt: str) -> tuple[str, dict]:
        raise NotImplementedError

    def read_event(self, event: str | None, data: Any) -> tuple[str, int | None, str]:
        """(text of this event, generated tokens if this is the final event else None, error)."""
        raise NotImplementedError

    async def one(self, client: httpx.AsyncClient, prompt: str) -> Sample:
        path, body = self.request(prompt)
        start = time.perf_counter()
        ttft = None
        parts: list[str] = []
        gaps: list[float] = []
        last_text_at = 0.0
        try:
            async with client.stream("POST", self.url + path, json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    return Sample(False, error=f"HTTP {response.status_code}: {text[:200]}")
                async for event, raw in sse_events(response):
                    if raw == "[DONE]":
                        continue
                    try:
                        data = json.loads(raw)
                    except ValueError:
                        return Sample(False, error=f"not JSON: {raw[:200]}")
                    text, final_tokens, error = self.read_event(event, data)
                    if error:
                        return Sample(False, error=error)
                    if text:
                        parts.append(text)
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = now - start
                        else:
                            gaps.append(now - last_text_at)
                        last_text_at = now
                    if final_tokens is not None:
                        end = time.perf_counter()
                        return Sample(True, end - start if ttft is None else ttft, end - start, final_tokens,
                                      text="".join(parts), final=data, gaps_s=gaps)
        except httpx.HTTPError as exc:
            return Sample(False, error=f"{type(exc).__name__}: {exc}")
        return Sample(False, error="stream ended without a final event")


class Cobatch(Target):
    name = "cobatch"

    def __init__(self, url: str, tokens: int, ignore_eos: bool = False, priority: str | None = None) -> None:
        super().__init__(url, tokens, ignore_eos)
        self.priority = priority  # "interactive" or "batch"; None: the server's default (batch)

    def request(self, prompt: str) -> tuple[str, dict]:
        body = {"prompt": prompt, "max_tokens": self.tokens, "stream": True, "repetition_penalty": 1.0,
                **SAMPLING, **NEUTRAL}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.priority is not None:
            body["priority"] = self.priority
        return "/generate", body

    def read_event(self, event: str | None, data: Any) -> tuple[str, int | None, str]:
        if event == "error":
            return "", None, json.dumps(data)[:300]
        if event == "done":
            # its text is the whole answer, already streamed as deltas: not a first token
            return "", int(data["metrics"]["tokens_generated"]), ""
        return data.get("text", ""), None, ""


class LlamaCpp(Target):
    name = "peer"

    def __init__(self, url: str, tokens: int, ignore_eos: bool = False, cache_prompt: bool = False) -> None:
        super().__init__(url, tokens, ignore_eos)
        self.cache_prompt = cache_prompt  # its per-slot prompt cache: off for plain load, on for chat

    def request(self, prompt: str) -> tuple[str, dict]:
        body = {"prompt": prompt, "n_predict": self.tokens, "stream": True, "cache_prompt": self.cache_prompt,
                "repeat_penalty": 1.0, **SAMPLING, **NEUTRAL}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return "/completion", body

    def read_event(self, event: str | None, data: Any) -> tuple[str, int | None, str]:
        if event == "error" or "error" in data:
            return "", None, json.dumps(data)[:300]
        text = data.get("content") or ""
        if data.get("stop"):
            n = data.get("tokens_predicted")
            if n is None:
                n = (data.get("timings") or {}).get("predicted_n", 0)
            return text, int(n), ""
        return text, None, ""


# ---------------------------------------------------------------------------------------------
# An in-process cobatch server


class InProcessServer:
    """cobatch's app on uvicorn, 127.0.0.1 and a free port, served from a daemon thread."""

    def __init__(self, model: str | None, threads: int, max_running: int, n_ctx: int) -> None:
        import uvicorn

        from server.app import create_app
        from server.context import ServerSettings

        def load_engine() -> Any:
            from engine import Engine

            return Engine(model, n_threads=threads, max_running=max_running, n_ctx=n_ctx,
                          step_token_budget=max(256, max_running))

        self.app = create_app(load_engine, ServerSettings(drain_timeout=10.0))
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, lifespan="on", log_level="warning", timeout_graceful_shutdown=20)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, timeout: float = 300.0) -> "InProcessServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        wait_healthy(self.url, deadline - time.monotonic())
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(60)
        self._sock.close()


class SpawnedServer:
    """`cobatch serve` in a child process (its own GIL, like any real deployment), stopped with
    SIGINT (its graceful drain)."""

    def __init__(self, model: str | None, threads: int, max_running: int, n_ctx: int,
                 extra_args: list[str] | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.command = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                        "--threads", str(threads), "--max-running", str(max_running), "--n-ctx", str(n_ctx),
                        "--step-token-budget", str(max(256, max_running)), "--log-level", "warning"]
        if model:
            self.command += ["--model", model]
        self.command += extra_args or []
        # Its own batch-job store, gone with it, unless the caller keeps one.
        self._data_dir = None if "--data-dir" in self.command else tempfile.TemporaryDirectory(prefix="cobatch-bench-")
        if self._data_dir is not None:
            self.command += ["--data-dir", self._data_dir.name]
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> "SpawnedServer":
        self.process = subprocess.Popen(self.command)
        try:
            wait_healthy(self.url, timeout, self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "SpawnedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._data_dir is not None:
            self._data_dir.cleanup()


def wait_healthy(url: str, timeout: float, process: "subprocess.Popen | None" = None) -> None:
    """Until GET {url}/health answers 200 (cobatch says 503 while the model loads)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"cobatch serve exited with status {process.returncode}")
        try:
            r = httpx.get(url.rstrip("/") + "/health", timeout=5.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    raise RuntimeError(f"{url} not healthy within {timeout:.0f} s ({last})")
