"""HTTP load sweep over concurrency: req/s, tok/s, TTFT, latency; side by side with a llama.cpp server if given.

(Over 300 lines: a third is this description of what is measured and how; the targets and the
launchers live in bench/http_targets.py.)

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
asked to ignore end-of-generation (`ignore_eos`), so both generate exactly --tokens tokens;
with --ignore-eos off a request may stop early and tok/s comes from the real counts (the mean
tokens per request of each side is printed under the table).

cobatch: POST {url}/generate with "stream": true (SSE `event: delta` / `event: done`). Without
--url a cobatch server is started in this process (uvicorn on 127.0.0.1, a free port, a
background thread) with the bundled model, --threads and max_running >= the top concurrency,
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

Same-run baseline, always (unless --no-raw-loop): right after each level, the raw llama_decode
loop (bench/raw_loop.py) decodes C sequences together in this process, with its own copy of the
model; cobatch/raw loop is the fraction of this machine's decode ceiling that reaches HTTP clients.

--page-view runs every cobatch level twice, once as above and once with the web page open: its
files loaded and its live view's event stream (GET /v1/engine/events) read throughout, as a
browser tab would; the two alternate in order from trial to trial, and "page open / closed" is
the median of their per-trial tok/s ratios (the view must cost the engine nothing).

--trials sweeps every level that many times. Within a level, cobatch, the peer and the raw loop
run back to back, so a drift in machine speed hits them alike; ratios are taken within a trial,
then their median. Each server gets one warm-up request first.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

from bench.neighbour import MODES, neighbour
from bench.peer import find_tool, llama_server
from bench.prompts import benchmark_prompts
from bench.record import RunRecord, add_record_arguments, publish
from bench.http_targets import Cobatch, InProcessServer, LlamaCpp, Sample, SpawnedServer, Target, wait_healthy
from bench.stats import percentile
from bench.table import markdown_table
from engine.model_source import resolve_model
from server.web.page import static_files



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


@dataclass
class LevelRuns:
    """Every trial of one concurrency level: cobatch's, the peer's, and the raw loop's tok/s."""

    concurrency: int
    cobatch: list[Level] = field(default_factory=list)
    peer: list[Level] = field(default_factory=list)
    raw_tok_s: list[float] = field(default_factory=list)
    viewed: list[Level] = field(default_factory=list)  # cobatch with the web page open (--page-view)

    def sides(self) -> list[tuple[str, list[Level]]]:
        return ([("cobatch", self.cobatch)] + ([("cobatch_page_open", self.viewed)] if self.viewed else [])
                + ([("peer", self.peer)] if self.peer else []))


def side_cells(levels: list[Level]) -> list[object]:
    """req/s and tok/s: medians over trials; TTFT and latency percentiles: over every sample."""
    ok = [s for level in levels for s in level.ok]
    if not ok:
        return ["failed"] * 6
    per_trial = [level.cells() for level in levels if level.ok]
    ttft = [s.ttft_s * 1000 for s in ok]
    lat = [s.latency_s * 1000 for s in ok]
    return [statistics.median(c[0] for c in per_trial), statistics.median(c[1] for c in per_trial),
            percentile(ttft, 50), percentile(ttft, 95), percentile(lat, 50), percentile(lat, 95)]


def paired_ratio(mine: list[Level], other: list[Level] | list[float]) -> float | None:
    """Median over trials of cobatch's tok/s over the other's, each pair from the same trial."""
    ratios = []
    for a, b in zip(mine, other):
        theirs = b if isinstance(b, float) else (b.cells()[1] if b.ok else 0.0)
        if a.ok and theirs:
            ratios.append(a.cells()[1] / theirs)
    return statistics.median(ratios) if ratios else None


@contextlib.asynccontextmanager
async def page_open(client: httpx.AsyncClient, url: str):
    """What a browser tab on the web page costs the server: its files, then its live view's
    event stream read as it comes, until the block ends."""
    for path in static_files():
        (await client.get(url + path)).raise_for_status()
    events = 0

    async def watch() -> None:
        nonlocal events
        async with client.stream("GET", url + "/v1/engine/events") as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                events += line.startswith("data:")

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"the page's event stream failed: {task.exception()}")
        if events == 0:
            raise RuntimeError("the page's event stream sent nothing during the level")


async def sweep(url: str, peer_url: str | None, levels: list[int], per_level: Callable[[int], int],
                tokens: int, ignore_eos: str, trials: int,
                raw_loop: Callable[[int], float] | None, page_view: bool = False,
                context_words: int = 0) -> tuple[list[LevelRuns], dict]:
    timeout = httpx.Timeout(600.0, connect=30.0)
    limits = httpx.Limits(max_connections=max(levels) * 2, max_keepalive_connections=max(levels) * 2)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        use_ignore = ignore_eos == "on"
        targets: list[Target] = [Cobatch(url, tokens, use_ignore)]
        if peer_url:
            targets.append(LlamaCpp(peer_url, tokens, use_ignore))
        for t in targets:  # warm-up: first decodes allocate buffers and graphs
            s = await t.one(client, "Warm-up: the quick brown fox")
            if not s.ok:
                raise RuntimeError(f"{t.name} at {t.url}: warm-up request failed: {s.error}")
        results = [LevelRuns(c) for c in levels]
        # Trials sweep every level in turn, and within a level the servers and the raw loop run
        # back to back: a drift in machine speed then hits all of them alike.
        for trial in range(trials):
            for runs in results:
                prompts = benchmark_prompts(per_level(runs.concurrency), context_words)
                for t in targets:
                    if t.name != "cobatch":
                        runs.peer.append(await run_level(t, client, prompts, runs.concurrency))
                        continue
                    for viewed in ((False, True) if trial % 2 == 0 else (True, False)) if page_view else (False,):
                        async with page_open(client, url) if viewed else contextlib.nullcontext():
                            level = await run_level(t, client, prompts, runs.concurrency)
                        (runs.viewed if viewed else runs.cobatch).append(level)
                if raw_loop is not None:
                    runs.raw_tok_s.append(raw_loop(runs.concurrency))
                print(f"trial {trial} C={runs.concurrency}: "
                      + ", ".join(f"{name} {side[-1].cells()[1] if side[-1].ok else 0:.1f} tok/s"
                                  for name, side in runs.sides())
                      + (f", raw loop {runs.raw_tok_s[-1]:.1f}" if runs.raw_tok_s else ""), file=sys.stderr)
    return results, {"ignore_eos": use_ignore}


def render(results: list[LevelRuns], per_level: Callable[[int], int], notes: dict) -> str:
    stats = ["req/s", "tok/s", "TTFT p50 ms", "TTFT p95 ms", "latency p50 ms", "latency p95 ms"]
    peer = bool(results[0].peer)
    raw = bool(results[0].raw_tok_s)
    headers = ["concurrency", "requests"] + [f"cobatch {s}" for s in stats]
    if raw:
        headers += ["raw loop tok/s (B=C)", "cobatch/raw loop"]
    if peer:
        headers += [f"peer {s}" for s in stats] + ["tok/s cobatch/peer"]
    viewed = bool(results[0].viewed)
    if viewed:
        headers += ["page open tok/s", "page open TTFT p95 ms", "tok/s page open / closed (per trial)"]
    rows = []
    for runs in results:
        row: list[object] = [runs.concurrency, per_level(runs.concurrency)] + side_cells(runs.cobatch)
        if raw:
            ratio = paired_ratio(runs.cobatch, runs.raw_tok_s)
            row += [statistics.median(runs.raw_tok_s), "-" if ratio is None else ratio]
        if peer:
            ratio = paired_ratio(runs.cobatch, runs.peer)
            row += side_cells(runs.peer) + ["-" if ratio is None else ratio]
        if viewed:
            open_ = side_cells(runs.viewed)
            each = [paired_ratio([a], [b]) for a, b in zip(runs.viewed, runs.cobatch)]
            ratio = paired_ratio(runs.viewed, runs.cobatch)
            row += [open_[1], open_[3], "-" if ratio is None else
                    f"{ratio:.3f} ({', '.join('-' if r is None else f'{r:.3f}' for r in each)})"]
        rows.append(row)
    trials = len(results[0].cobatch)
    lines = [f"{trials} trial(s) per level. req/s and tok/s are medians over trials, ratios the median "
             f"of each trial's ratio; TTFT and latency percentiles pool every request of every trial."]
    if raw:
        lines.append("Raw loop: the plain llama_decode + argmax loop of bench/raw_loop.py in this process, "
                     "C sequences decoding together right after the level (generation steps only: no "
                     "prefill, no sampling, no HTTP), so cobatch/raw loop is the fraction of the machine's "
                     "decode ceiling that reaches the clients.")
    lines += ["", markdown_table(headers, rows), ""]
    for name, side in [("cobatch", [lv for r in results for lv in r.cobatch])] + (
            [("peer", [lv for r in results for lv in r.peer])] if peer else []):
        ok = [s for level in side for s in level.ok]
        failed = [s for level in side for s in level.failed]
        mean = statistics.mean(s.tokens for s in ok) if ok else 0.0
        line = f"{name}: {mean:.1f} generated tokens per request on average"
        if failed:
            line += f"; {len(failed)} failed request(s), excluded; first error: {failed[0].error}"
        lines.append(line)
    lines.append(f"ignore_eos: {'sent to both' if notes['ignore_eos'] else 'not sent (tok/s from real token counts)'}")
    return "\n".join(lines)


class RawLoopBaseline:
    """The raw llama_decode loop at B = C on this machine, with its own copy of the model."""

    def __init__(self, model: str | None, threads: int, top: int, tokens: int, context_words: int = 0) -> None:
        from bindings import Model

        self.model = Model(str(resolve_model(model)))
        self.threads, self.top, self.tokens = threads, top, tokens
        self.prompts = [self.model.tokenize(p, add_bos=True) for p in benchmark_prompts(top, context_words)]
        self.rows = max(512, sum(len(p) for p in self.prompts))  # every prompt prefills in one batch
        self.context = None

    def __call__(self, concurrency: int, threads: int | None = None) -> float:
        """tok/s at B = concurrency, with `threads` (default: the constructor's) for this run."""
        from bench.raw_loop import raw_loop_context, run_raw_loop

        if self.context is None:
            self.context = raw_loop_context(self.model, self.top, self.threads,
                                            n_ctx=max(4096, self.rows + self.top * (self.tokens + 64)), batch_rows=self.rows)
        self.context.set_threads(threads or self.threads)
        run = run_raw_loop(self.model, self.prompts[:concurrency], max(self.tokens, 2), context=self.context,
                           batch_rows=self.rows)
        return concurrency * run.steps / run.decode_seconds

    def close(self) -> None:
        if self.context is not None:
            self.context.close()
        self.model.close()


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench http-load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated levels")
    parser.add_argument("--requests-per-level", type=int, default=None,
                        help="requests per level (default: 2 x concurrency, at least 4)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--context-words", type=int, default=0,
                        help="words of context before each prompt (distinct per prompt, like retrieved text)")
    parser.add_argument("--url", default=None,
                        help="a running cobatch server (default: start one in this process)")
    parser.add_argument("--peer-url", default=None, help="a llama.cpp server (its /completion) to compare with")
    parser.add_argument("--ignore-eos", choices=["on", "off"], default="on",
                        help="send ignore_eos to both, so both generate exactly --tokens tokens")
    parser.add_argument("--spawn", action="store_true",
                        help="without --url: run `cobatch serve` in a child process instead of in this one")
    parser.add_argument("--serve-args", default="",
                        help="with --spawn: more `cobatch serve` flags, e.g. \"--flash-attn on\"")
    parser.add_argument("--threads", type=int, default=2, help="started server: CPU threads")
    parser.add_argument("--model", default=None, help="started server: GGUF path (default: the bundled one)")
    parser.add_argument("--n-ctx", type=int, default=8192, help="started server: KV cells")
    parser.add_argument("--peer-bin", default=None,
                        help="a llama-server binary (or its folder), default: llama-server on PATH if "
                             "there is one; started on loopback with the same model, threads, one slot "
                             "per top-level client and -kvu, then stopped")
    parser.add_argument("--no-peer", action="store_true", help="do not start a llama-server even if on PATH")
    parser.add_argument("--trials", type=int, default=3, help="sweeps over every level")
    parser.add_argument("--no-raw-loop", action="store_true",
                        help="skip the raw llama_decode loop baseline (it runs on this machine: skip it "
                             "when --url points elsewhere)")
    parser.add_argument("--neighbour", choices=MODES, default="none",
                        help="a busy process on the machine for the whole sweep (bench/neighbour.py)")
    parser.add_argument("--page-view", action="store_true",
                        help="also run each cobatch level with the web page open (its event stream read), alternating")
    parser.add_argument("--quick", action="store_true", help="tiny settings, for tests")
    add_record_arguments(parser)
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.serve_args and not args.spawn:
        parser.error("--serve-args needs --spawn (they are flags of the `cobatch serve` it starts)")
    if args.peer_bin and args.peer_url:
        parser.error("--peer-bin starts a peer; --peer-url names a running one: give one of them")
    levels = [int(x) for x in args.concurrency.split(",")]
    if args.quick:
        levels, args.tokens, args.requests_per_level, args.trials = [1, 2], 4, 2, 1
    fixed = args.requests_per_level

    def per_level(c: int) -> int:
        return fixed if fixed is not None else max(4, 2 * c)

    record = RunRecord("http-load", args, args.model, argv)  # the checkout as the run starts
    local = None
    if args.url is None:
        try:
            settings = (args.model, args.threads, max(32, max(levels)), args.n_ctx)
            local = (SpawnedServer(*settings, shlex.split(args.serve_args)) if args.spawn
                     else InProcessServer(*settings)).start()
        except RuntimeError as exc:
            print(f"http-load: {exc}", file=sys.stderr)
            return 1
        url = local.url
    else:
        url = args.url
        wait_healthy(url, 300.0)
    raw_loop = None
    try:
        if not args.no_raw_loop:
            raw_loop = RawLoopBaseline(args.model, args.threads, max(levels), args.tokens, args.context_words)
        # A llama-server given with --peer-bin, or found on PATH, is started as the peer
        # (not in quick mode, so the test stays hermetic, nor with --peer-url or --no-peer).
        binary = None
        if not (args.peer_url or args.no_peer or (args.quick and not args.peer_bin)):
            binary = find_tool("llama-server", args.peer_bin)
        peer = contextlib.nullcontext(args.peer_url)
        if binary:
            peer = llama_server(binary, str(resolve_model(args.model)), args.threads, max(levels), args.n_ctx)
        with peer as peer_url, neighbour(args.neighbour):
            args.peer_url = peer_url
            results, notes = asyncio.run(sweep(url, peer_url, levels, per_level, args.tokens, args.ignore_eos,
                                               args.trials, raw_loop, args.page_view, args.context_words))
    except (RuntimeError, OSError) as exc:  # a server that is not there or refuses the workload
        print(f"http-load: {exc}", file=sys.stderr)
        return 1
    finally:
        if raw_loop is not None:
            raw_loop.close()
        if local is not None:
            local.stop()
    where = url if local is None else (f"child process {args.serve_args}".strip() if args.spawn else "in-process")
    peer_name = f"llama-server ({binary})" if binary else args.peer_url
    header = (f"cobatch: {where}" + (f"; peer: {peer_name}" if args.peer_url else "")
              + f"; {args.tokens} tokens per request"
              + (f" after {args.context_words} words of context" if args.context_words else "")
              + "; temperature 0.7, top-k 40, top-p 0.9; "
              f"neighbour: {args.neighbour}\n")
    summary = header + "\n" + render(results, per_level, notes)
    for runs in results:
        for name, side in runs.sides():
            for trial, level in enumerate(side):
                record.trial(trial=trial, system=name, concurrency=level.concurrency, wall_s=level.wall_s,
                             samples=[{k: v for k, v in dataclasses.asdict(x).items() if k not in ("text", "final")}
                                      for x in level.samples])
        for trial, tok_s in enumerate(runs.raw_tok_s):
            record.trial(trial=trial, system="raw_loop", concurrency=runs.concurrency, tok_s=tok_s)
    top = results[-1]
    mine = side_cells(top.cobatch)
    headline = {f"cobatch_tok_s_c{top.concurrency}": round(mine[1], 1) if top.cobatch[0].ok else 0}
    if top.raw_tok_s and (ratio := paired_ratio(top.cobatch, top.raw_tok_s)) is not None:
        headline["fraction_of_raw_loop"] = round(ratio, 2)
    if top.peer and top.peer[0].ok:
        headline[f"peer_tok_s_c{top.concurrency}"] = round(side_cells(top.peer)[1], 1)
    for runs in results:
        if runs.peer and (ratio := paired_ratio(runs.cobatch, runs.peer)) is not None:
            headline[f"ratio_c{runs.concurrency}"] = round(ratio, 2)
        if runs.viewed and (ratio := paired_ratio(runs.viewed, runs.cobatch)) is not None:
            headline[f"page_open_over_closed_c{runs.concurrency}"] = round(ratio, 3)
    publish(record, summary, headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
