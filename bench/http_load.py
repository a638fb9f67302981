"""HTTP load sweep over concurrency: req/s, tok/s, TTFT, latency; side by side with a llama.cpp server if given.

For each concurrency C, C client workers (asyncio + httpx, one process) pull a fixed number of
requests from a shared queue and send each as soon as their previous one finished (a closed
loop). Every request is a streamed generation of `--tokens` tokens from one of bench/prompts.py's
prompts with temperature 0.7, top-k 40, top-p 0.9 (min-p 0, no repetition penalty, the same
for both servers). Measured on the client:

  TTFT     from sending the request to the first event carrying non-empty text
  latency  from sending the request to the final event
  tok/s    generated tokens of the level / wall time of the level (first send to last answer)
  req/s    requests of the level / wall time of the level

Generated tokens are the servers' own counts: `metrics.tokens_generated` of cobatch's final
`event: done`, `tokens_predicted` of llama.cpp's final `stop: true` chunk. Both servers are
asked to ignore end-of-generation (`ignore_eos`) only if cobatch's /generate accepts that field
(probed once; it is then sent to both); otherwise neither is, a request may stop early at an
end-of-generation token, and tok/s is computed from the real counts (the mean tokens per
request of each side is printed under the table).

cobatch: POST {url}/generate with "stream": true (SSE `event: delta` / `event: done`). Without
--url a cobatch server is started in this process (uvicorn on 127.0.0.1, a free port, a
background thread) with the bundled model, --threads and max_batch >= the top concurrency,
and stopped at the end; it then shares this process (and its GIL) with the client, which costs
it throughput at high concurrency. --spawn runs `cobatch serve` in a child process instead,
the like-for-like setting for a comparison with llama-server (also a separate process).

Peer (--peer-url): any server speaking llama.cpp's native `POST /completion`, sent
{"prompt", "n_predict", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "stream":
true, "cache_prompt": false}; it answers with `data: {"content": ..., "stop": false}` lines and
a last `stop: true` chunk carrying `tokens_predicted` and `timings`. To compare with llama.cpp
on the same model, threads and sampling settings, e.g.

  llama-server -m gemma-3-270m-Q4_K_M.gguf -t 2 -np 16 -kvu -c 8192 --port 8080
  cobatch bench http-load --peer-url http://127.0.0.1:8080

Or let the benchmark run llama-server itself: with --peer-bin PATH, or by default when
llama-server is on PATH (--no-peer to skip), it starts it on loopback with the same model,
threads, one slot per top-level client and -kvu, and stops it at the end.

The levels run cobatch then the peer, one level at a time, so a drift in machine speed hits
both alike. Each server gets one warm-up request first.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import httpx

from bench.peer import find_tool, llama_server
from bench.prompts import benchmark_prompts
from bench.record import RunRecord, add_record_arguments, publish
from bench.sse import Event, SseDecoder
from bench.stats import percentile
from bench.table import markdown_table
from engine.model_source import resolve_model

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
                    if text and ttft is None:
                        ttft = time.perf_counter() - start
                    if final_tokens is not None:
                        end = time.perf_counter()
                        return Sample(True, end - start if ttft is None else ttft, end - start, final_tokens)
        except httpx.HTTPError as exc:
            return Sample(False, error=f"{type(exc).__name__}: {exc}")
        return Sample(False, error="stream ended without a final event")


class Cobatch(Target):
    name = "cobatch"

    def request(self, prompt: str) -> tuple[str, dict]:
        body = {"prompt": prompt, "max_tokens": self.tokens, "stream": True, "repetition_penalty": 1.0,
                **SAMPLING, **NEUTRAL}
        if self.ignore_eos:
            body["ignore_eos"] = True
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

    def request(self, prompt: str) -> tuple[str, dict]:
        body = {"prompt": prompt, "n_predict": self.tokens, "stream": True, "cache_prompt": False,
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
# One level


@dataclass
class Level:
    concurrency: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def failed(self) -> list[Sample]:
        return [s for s in self.samples if not s.ok]

    def cells(self) -> list[object]:
        ok = self.ok
        if not ok:
            return ["failed"] * 6
        ttft = [s.ttft_s * 1000 for s in ok]
        lat = [s.latency_s * 1000 for s in ok]
        return [len(ok) / self.wall_s, sum(s.tokens for s in ok) / self.wall_s,
                percentile(ttft, 50), percentile(ttft, 95), percentile(lat, 50), percentile(lat, 95)]


async def run_level(target: Target, client: httpx.AsyncClient, prompts: list[str], concurrency: int) -> Level:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    samples: list[Sample] = []

    async def worker() -> None:
        while True:
            try:
                prompt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            samples.append(await target.one(client, prompt))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Level(concurrency, time.perf_counter() - start, samples)


# ---------------------------------------------------------------------------------------------
# The sweep


async def supports_ignore_eos(client: httpx.AsyncClient, url: str) -> bool:
    """Whether cobatch's /generate accepts `ignore_eos` (it refuses unknown fields with 400)."""
    r = await client.post(url.rstrip("/") + "/generate",
                          json={"prompt": "Hello", "max_tokens": 1, "ignore_eos": True})
    return r.status_code == 200


async def sweep(url: str, peer_url: str | None, levels: list[int], per_level: Callable[[int], int],
                tokens: int, ignore_eos: str) -> tuple[list[tuple[Level, Level | None]], dict]:
    timeout = httpx.Timeout(600.0, connect=30.0)
    limits = httpx.Limits(max_connections=max(levels) * 2, max_keepalive_connections=max(levels) * 2)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        if ignore_eos == "auto":
            use_ignore = await supports_ignore_eos(client, url)
        else:
            use_ignore = ignore_eos == "on"
        targets: list[Target] = [Cobatch(url, tokens, use_ignore)]
        if peer_url:
            targets.append(LlamaCpp(peer_url, tokens, use_ignore))
        for t in targets:  # warm-up: first decodes allocate buffers and graphs
            s = await t.one(client, "Warm-up: the quick brown fox")
            if not s.ok:
                raise RuntimeError(f"{t.name} at {t.url}: warm-up request failed: {s.error}")
        results = []
        for c in levels:
            prompts = benchmark_prompts(per_level(c))
            measured = [await run_level(t, client, prompts, c) for t in targets]
            results.append((measured[0], measured[1] if peer_url else None))
    return results, {"ignore_eos": use_ignore}


def render(results: list[tuple[Level, Level | None]], per_level: Callable[[int], int], notes: dict) -> str:
    stats = ["req/s", "tok/s", "TTFT p50 ms", "TTFT p95 ms", "latency p50 ms", "latency p95 ms"]
    peer = results[0][1] is not None
    headers = ["concurrency", "requests"] + [f"cobatch {s}" for s in stats]
    if peer:
        headers += [f"peer {s}" for s in stats] + ["tok/s cobatch/peer"]
    rows = []
    for mine, theirs in results:
        row: list[object] = [mine.concurrency, per_level(mine.concurrency)] + mine.cells()
        if theirs is not None:
            other = theirs.cells()
            ratio = mine.cells()[1] / other[1] if mine.ok and theirs.ok and other[1] else "-"
            row += other + [ratio]
        rows.append(row)
    lines = [markdown_table(headers, rows), ""]
    sides = [("cobatch", [m for m, _ in results])] + ([("peer", [p for _, p in results])] if peer else [])
    for name, side in sides:
        ok = [s for level in side for s in level.ok]
        failed = [s for level in side for s in level.failed]
        mean = statistics.mean(s.tokens for s in ok) if ok else 0.0
        line = f"{name}: {mean:.1f} generated tokens per request on average"
        if failed:
            line += f"; {len(failed)} failed request(s), excluded; first error: {failed[0].error}"
        lines.append(line)
    lines.append(f"ignore_eos: {'sent to both' if notes['ignore_eos'] else 'not sent (tok/s from real token counts)'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# An in-process cobatch server


class InProcessServer:
    """cobatch's app on uvicorn, 127.0.0.1 and a free port, served from a daemon thread."""

    def __init__(self, model: str | None, threads: int, max_batch: int, n_ctx: int) -> None:
        import uvicorn

        from server.app import create_app
        from server.context import ServerSettings

        def load_engine() -> Any:
            from engine import Engine

            return Engine(model, n_threads=threads, max_batch=max_batch, n_ctx=n_ctx,
                          step_token_budget=max(256, max_batch))

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

    def __init__(self, model: str | None, threads: int, max_batch: int, n_ctx: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.command = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                        "--threads", str(threads), "--max-batch", str(max_batch), "--n-ctx", str(n_ctx),
                        "--step-token-budget", str(max(256, max_batch)), "--log-level", "warning"]
        if model:
            self.command += ["--model", model]
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> "SpawnedServer":
        self.process = subprocess.Popen(self.command)
        try:
            wait_healthy(self.url, timeout, self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench http-load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated levels")
    parser.add_argument("--requests-per-level", type=int, default=None,
                        help="requests per level (default: 2 x concurrency, at least 4)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--url", default=None,
                        help="a running cobatch server (default: start one in this process)")
    parser.add_argument("--peer-url", default=None, help="a llama.cpp server (its /completion) to compare with")
    parser.add_argument("--ignore-eos", choices=["auto", "on", "off"], default="auto",
                        help="send ignore_eos to both (auto: if cobatch's /generate accepts it)")
    parser.add_argument("--spawn", action="store_true",
                        help="without --url: run `cobatch serve` in a child process instead of in this one")
    parser.add_argument("--threads", type=int, default=2, help="started server: CPU threads")
    parser.add_argument("--model", default=None, help="started server: GGUF path (default: the bundled one)")
    parser.add_argument("--n-ctx", type=int, default=8192, help="started server: KV cells")
    parser.add_argument("--peer-bin", default=None,
                        help="a llama-server binary (or its folder), default: llama-server on PATH if "
                             "there is one; started on loopback with the same model, threads, one slot "
                             "per top-level client and -kvu, then stopped")
    parser.add_argument("--no-peer", action="store_true", help="do not start a llama-server even if on PATH")
    parser.add_argument("--quick", action="store_true", help="tiny settings, for tests")
    add_record_arguments(parser)
    args = parser.parse_args(argv)
    if args.peer_bin and args.peer_url:
        parser.error("--peer-bin starts a peer; --peer-url names a running one: give one of them")
    levels = [int(x) for x in args.concurrency.split(",")]
    if args.quick:
        levels, args.tokens, args.requests_per_level = [1, 2], 4, 2
    fixed = args.requests_per_level

    def per_level(c: int) -> int:
        return fixed if fixed is not None else max(4, 2 * c)

    local = None
    if args.url is None:
        kind = SpawnedServer if args.spawn else InProcessServer
        try:
            local = kind(args.model, args.threads, max(32, max(levels)), args.n_ctx).start()
        except RuntimeError as exc:
            print(f"http-load: {exc}", file=sys.stderr)
            return 1
        url = local.url
    else:
        url = args.url
        wait_healthy(url, 300.0)
    try:
        # A llama-server given with --peer-bin, or found on PATH, is started as the peer
        # (not in quick mode, so the test stays hermetic, nor with --peer-url or --no-peer).
        binary = None
        if not (args.peer_url or args.no_peer or (args.quick and not args.peer_bin)):
            binary = find_tool("llama-server", args.peer_bin)
        peer = contextlib.nullcontext(args.peer_url)
        if binary:
            peer = llama_server(binary, str(resolve_model(args.model)), args.threads, max(levels), args.n_ctx)
        with peer as peer_url:
            args.peer_url = peer_url
            results, notes = asyncio.run(sweep(url, peer_url, levels, per_level, args.tokens, args.ignore_eos))
    except (RuntimeError, OSError) as exc:  # a server that is not there or refuses the workload
        print(f"http-load: {exc}", file=sys.stderr)
        return 1
    finally:
        if local is not None:
            local.stop()
    where = url if local is None else ("child process" if args.spawn else "in-process")
    peer_name = f"llama-server ({binary})" if binary else args.peer_url
    header = (f"cobatch: {where}" + (f"; peer: {peer_name}" if args.peer_url else "")
              + f"; {args.tokens} tokens per request; temperature 0.7, top-k 40, top-p 0.9\n")
    summary = header + "\n" + render(results, per_level, notes)
    record = RunRecord("http-load", args, args.model, argv)
    for mine, theirs in results:
        for side, level in (("cobatch", mine), ("peer", theirs)):
            if level is not None:
                record.trial(system=side, concurrency=level.concurrency, wall_s=level.wall_s,
                             samples=[dataclasses.asdict(x) for x in level.samples])
    top_mine, top_peer = results[-1]
    headline = {f"cobatch_tok_s_c{top_mine.concurrency}": round(top_mine.cells()[1], 1) if top_mine.ok else 0}
    if top_peer is not None and top_peer.ok and top_mine.ok:
        headline[f"peer_tok_s_c{top_peer.concurrency}"] = round(top_peer.cells()[1], 1)
        headline["ratio"] = round(top_mine.cells()[1] / top_peer.cells()[1], 2)
    publish(record, summary, headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
