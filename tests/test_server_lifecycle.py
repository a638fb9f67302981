"""Loading → ok, load failure, draining at shutdown, and the `cobatch` command line."""
from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
import types

import httpx
import pytest

from bench.sse import sse_events
from server import cli
from tests.server_fixtures import (
    assert_engine_idle,
    running_server,
    serve_process,
    shared_engine,
    wait_until,
)

pytestmark = pytest.mark.model



@pytest.fixture(scope="module")
def engine():
    return shared_engine()


def test_health_says_loading_until_the_model_is_ready(engine):
    release = threading.Event()

    def slow_loader():
        release.wait(30)
        return engine

    with running_server(slow_loader, engine, wait_ready=False) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        refused = client.post("/generate", json={"prompt": "Hi", "max_tokens": 2})
        assert refused.status_code == 503 and "still loading" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "2"
        assert client.get("/v1/models").status_code == 503
        assert client.get("/metrics").status_code == 200  # scrapeable while loading
        release.set()
        wait_until(lambda: client.get("/health").status_code == 200, 30, "never became ready")
        assert client.get("/health").json()["status"] == "ok"
        assert client.post("/generate", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
    assert_engine_idle(engine)


def test_a_model_that_fails_to_load_is_reported(engine):
    def broken_loader():
        raise FileNotFoundError("model not found: /nowhere.gguf")

    with running_server(broken_loader, wait_ready=False) as server, httpx.Client(base_url=server.url) as client:
        wait_until(lambda: client.get("/health").json()["status"] == "failed", 10, "failure not reported")
        health = client.get("/health")
        assert health.status_code == 503 and "/nowhere.gguf" in health.json()["error"]
        refused = client.post("/generate", json={"prompt": "Hi"})
        assert refused.status_code == 503 and "failed to load" in refused.json()["error"]["message"]


def _stream_in_background(url: str, body: dict) -> tuple[threading.Thread, dict]:
    """Runs a streaming /generate on a thread; `out` gets 'first' (an Event) and 'events'."""
    out: dict = {"first": threading.Event()}

    def run():
        with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", "/generate", json=body) as r:
            events = []
            for name, data in sse_events(r.iter_lines()):
                events.append((name, json.loads(data)))
                out["first"].set()
            out["events"] = events

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_shutdown_refuses_new_requests_and_lets_running_ones_finish(engine):
    with running_server(lambda: engine, engine, drain_timeout=30) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        thread, out = _stream_in_background(
            server.url, {"prompt": "Tell me about whales.", "max_tokens": 24, "temperature": 0, "stream": True})
        assert out["first"].wait(30)
        server.ctx.state.begin_shutdown()  # what SIGTERM/SIGINT trigger
        refused = client.post("/generate", json={"prompt": "Hi", "max_tokens": 2})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        thread.join(60)
        name, final = out["events"][-1]
        assert name == "done" and final["finish_reason"] in ("length", "stop")
        assert server.ctx.state.wait_stopped(10) and server.ctx.state.status == "stopped"
    assert_engine_idle(engine)


def test_drain_timeout_cancels_what_is_still_running(engine):
    with running_server(lambda: engine, engine, drain_timeout=0.5) as server:
        thread, out = _stream_in_background(
            server.url, {"prompt": "Tell me everything about the ocean.", "max_tokens": 1900, "stream": True})
        assert out["first"].wait(30)
        started = time.monotonic()
        server.ctx.state.begin_shutdown()
        thread.join(30)
        assert time.monotonic() - started < 10
        name, final = out["events"][-1]
        assert name == "error" and final["finish_reason"] == "cancelled"
        assert "shutting down" in final["error"]["message"]
    assert_engine_idle(engine)


def test_an_app_whose_user_is_cancelled_still_drains_before_it_returns(engine):
    # `cobatch batch` on Ctrl-C: its lifespan is left by a cancellation, not by uvicorn's
    # shutdown. Returning with the engine still stepping let the process exit mid-decode.
    from server.app import create_app
    from server.context import ServerSettings

    app = create_app(lambda: engine, ServerSettings(owns_engine=False, drain_timeout=10.0))
    state = app.state.ctx.state

    async def run_until_cancelled() -> None:
        async with app.router.lifespan_context(app):
            while state.status != "ok":
                await asyncio.sleep(0.01)
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run_until_cancelled())
    assert state.status == "stopped"
    assert_engine_idle(engine)


def test_bench_subcommand_delegates_to_bench_cli(monkeypatch):
    seen = []
    fake = types.ModuleType("bench.cli")
    fake.main = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, "bench.cli", fake)
    assert cli.main(["bench", "--requests", "5", "--help"]) == 7
    assert seen == [["--requests", "5", "--help"]]


def test_serve_rejects_a_missing_model_file_at_once(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--model", "/definitely/not/here.gguf"])
    assert info.value.code == 2 and "no such file" in capsys.readouterr().err


def test_serve_flags_select_the_engine_options(capsys):
    options = cli._parser().parse_args(["serve", "--no-prefix-cache", "--cache-max-fraction", "0.05",
                                        "--no-priority", "--max-batch", "8", "--flash-attn", "off"])
    chosen = cli.engine_options_from(options)
    assert chosen["prefix_cache"] is False and chosen["cache_max_fraction"] == 0.05
    assert chosen["priority_scheduling"] is False and chosen["max_running"] == 8 and chosen["flash_attn"] is False
    defaults = cli.engine_options_from(cli._parser().parse_args(["serve"]))
    assert defaults["prefix_cache"] is True and defaults["cache_max_fraction"] == 0.25
    assert defaults["flash_attn"] is True
    assert defaults["interactive_batch_rows"] is None and defaults["adaptive_threads"] is True
    assert defaults["interactive_token_ms"] == 150
    assert cli.engine_options_from(cli._parser().parse_args(["serve", "--interactive-token-ms", "0"]))[
        "interactive_token_ms"] is None
    unbounded = cli.engine_options_from(cli._parser().parse_args(
        ["serve", "--interactive-batch-rows", "0", "--no-adaptive-threads"]))
    assert unbounded["interactive_batch_rows"] is None and unbounded["adaptive_threads"] is False
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--cache-max-fraction", "1.5"])
    assert info.value.code == 2 and "--cache-max-fraction must be between 0 and 1" in capsys.readouterr().err


def test_signal_handler_starts_the_drain_and_a_second_ctrl_c_forces_exit():
    import uvicorn

    from server.draining_server import DrainingServer

    calls = []
    server = DrainingServer(uvicorn.Config(app=None), on_signal=lambda: calls.append(1))
    server.handle_exit(signal.SIGINT, None)
    assert calls == [1] and server.should_exit and not server.force_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.force_exit
    assert server._captured_signals == []  # not re-raised after a clean drain: exit status 0


def test_cobatch_serve_drains_and_exits_cleanly_on_sigterm(tmp_path):
    with serve_process("--n-ctx", "1024", "--max-running", "2", "--step-token-budget", "64", "--drain-timeout", "30",
                       "--data-dir", str(tmp_path)) as (proc, url):
        thread, out = _stream_in_background(
            url, {"prompt": "Name some birds.", "max_tokens": 20, "temperature": 0, "stream": True})
        assert out["first"].wait(30)
        proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert proc.wait(60) == 0
        name, final = out["events"][-1]
        assert name == "done" and final["finish_reason"] in ("length", "stop")
        with pytest.raises(httpx.TransportError):  # no longer listening
            httpx.get(f"{url}/health", timeout=2)
