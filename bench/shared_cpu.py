"""A shared machine: closed-loop HTTP load on `cobatch serve` with a busy neighbour process, the
thread governor on and off, quiet and under each neighbour, in one run.

Each trial runs every neighbour mode in turn (interleaved with the servers, so drift hits all
alike). Per mode, each server gets the same closed-loop load: C clients, each sending a streamed
`--tokens`-token request (ignore_eos, so every side generates the same count) as soon as its last
one finished. Servers, all spawned as `cobatch serve` child processes with the same flags:

  governor  the default: each step runs the thread count measured fastest
  fixed     --no-adaptive-threads: always --threads (what cobatch did before the governor)
  peer      llama-server (`-t T -np C -kvu`), when one is found on PATH or given (--peer-bin)

and, as the machine's own ceiling under the same neighbour (unless --no-raw-loop), the raw
llama_decode loop (bench/raw_loop.py) decoding C sequences in this process, at --threads and at
one thread: what any server built on llama.cpp could reach with that thread count there and then.

Neighbour modes (bench/neighbour.py): `none`; `nice19` (same session, where nice is honoured);
`nice19-session` (its own session: with sched_autogroup it competes at full weight whatever its
nice value, as any other service or login on the machine does); `nice0`.

Reported within each trial: tok/s per server and mode, each under-neighbour figure over the same
server's quiet figure, and the governor over fixed and over llama-server under the same mode.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from typing import Any

import httpx

from bench.http_load import RawLoopBaseline, run_level
from bench.http_targets import Cobatch, LlamaCpp, SpawnedServer
from bench.neighbour import MODES, neighbour
from bench.peer import add_peer_arguments, llama_server, peer_binary
from bench.prompts import benchmark_prompts
from bench.record import RunRecord, add_common_arguments, publish_report
from bench.table import markdown_table
from engine.model_source import resolve_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench shared-cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--neighbour", default="none,nice19,nice19-session,nice0",
                        help=f"comma-separated modes among {', '.join(MODES)}")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32, help="requests per server, mode and trial")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--no-raw-loop", action="store_true", help="skip the raw llama_decode loop rows")
    add_common_arguments(parser, trials=2)
    add_peer_arguments(parser)
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.neighbour.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error(f"--neighbour: unknown mode(s) {bad}; choose among {', '.join(MODES)}")
    if args.quick:
        modes = [m for m in modes if m in ("none", "nice19")] or ["none"]
        args.concurrency, args.requests, args.tokens, args.trials = 2, 2, 4, 1
    binary = peer_binary(args)
    servers = {
        "governor": SpawnedServer(args.model, args.threads, max(32, args.concurrency), 4096),
        "fixed": SpawnedServer(args.model, args.threads, max(32, args.concurrency), 4096, ["--no-adaptive-threads"]),
    }
    prompts = benchmark_prompts(args.requests)
    results: dict[tuple[int, str, str], dict[str, Any]] = {}
    record = RunRecord("shared-cpu", args, args.model, argv)
    raw_loops = {} if args.no_raw_loop else {"raw loop": args.threads, "raw loop, 1 thread": 1}
    try:
        with contextlib.ExitStack() as running:
            for server in servers.values():
                running.enter_context(server)
            raw_loop = (running.enter_context(contextlib.closing(
                RawLoopBaseline(args.model, args.threads, args.concurrency, args.tokens))) if raw_loops else None)
            peer_url = running.enter_context(
                llama_server(binary, str(resolve_model(args.model)), args.threads, args.concurrency, 4096)
                if binary else contextlib.nullcontext(None))
            targets = {name: Cobatch(s.url, args.tokens, ignore_eos=True) for name, s in servers.items()}
            if peer_url:
                targets["peer"] = LlamaCpp(peer_url, args.tokens, ignore_eos=True)
            for trial in range(args.trials):
                for mode in modes:
                    with neighbour(mode):
                        for name, target in targets.items():
                            row = asyncio.run(_measure(target, prompts, args.concurrency))
                            if name in servers:
                                row.update(_threads(servers[name].url))
                            results[(trial, mode, name)] = row
                            record.trial(trial=trial, neighbour=mode, server=name, **row)
                        for name, threads in raw_loops.items():
                            row = {"tok_s": raw_loop(args.concurrency, threads), "failed": 0}
                            results[(trial, mode, name)] = row
                            record.trial(trial=trial, neighbour=mode, server=name, **row)
    except (RuntimeError, OSError) as exc:
        print(f"shared-cpu: {exc}", file=sys.stderr)
        return 1
    names = ["governor", "fixed"] + (["peer"] if binary else []) + list(raw_loops)
    publish_report(record, lambda: _report(results, modes, names, args))
    return 0


async def _measure(target: Any, prompts: list[str], concurrency: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0)) as client:
        level = await run_level(target, client, prompts, concurrency)
    ok = level.ok
    return {"tok_s": sum(s.tokens for s in ok) / level.wall_s if ok else 0.0, "wall_s": level.wall_s,
            "ok": len(ok), "failed": len(level.failed),
            "latency_p95_s": sorted(s.latency_s for s in ok)[int(0.95 * (len(ok) - 1))] if ok else None}


def _threads(url: str) -> dict[str, Any]:
    health = httpx.get(url + "/health", timeout=10).json()
    return {"decode_threads": health.get("decode_threads"), "thread_switches": health.get("thread_switches")}


def _report(results: dict, modes: list[str], names: list[str], args: argparse.Namespace) -> tuple[str, dict]:
    trials = sorted({t for t, _, _ in results})

    def ratio(mode: str, a: str, b: str, b_mode: str | None = None) -> float | None:
        values = []
        for t in trials:
            num, den = results.get((t, mode, a)), results.get((t, b_mode or mode, b))
            if num and den and den["tok_s"] > 0:
                values.append(num["tok_s"] / den["tok_s"])
        return statistics.median(values) if values else None

    rows = []
    for mode in modes:
        for name in names:
            cells = [results[(t, mode, name)] for t in trials if (t, mode, name) in results]
            tok = statistics.median(c["tok_s"] for c in cells)
            threads = ", ".join(f"{c.get('decode_threads')}/{c.get('thread_switches')}" for c in cells
                                if c.get("decode_threads") is not None)
            rows.append([mode, name, tok, ratio(mode, name, name, "none") if "none" in modes else "-",
                         ratio(mode, "governor", name) if name != "governor" else "-", threads or "-",
                         sum(c["failed"] for c in cells)])
    table = markdown_table(["neighbour", "server", "tok/s (median)", "/ same server quiet",
                            "governor / this server", "threads/switches at end", "failed"], rows)
    header = (f"C={args.concurrency}, {args.tokens} tokens per request (ignore_eos), {args.requests} requests per "
              f"server and mode, --threads {args.threads}, {len(trials)} trial(s); ratios are medians of "
              f"within-trial ratios.\n")
    headline: dict[str, Any] = {}
    for mode in modes:
        if mode != "none" and (r := ratio(mode, "governor", "governor", "none")) is not None:
            headline[f"governor_{mode}_over_quiet"] = round(r, 2)
        if "peer" in names and (r := ratio(mode, "governor", "peer")) is not None:
            headline[f"governor_over_peer_{mode}"] = round(r, 2)
        if mode != "none" and (r := ratio(mode, "governor", "fixed")) is not None:
            headline[f"governor_over_fixed_{mode}"] = round(r, 2)
        for raw in (n for n in names if n.startswith("raw loop")):
            key = raw.replace("raw loop, 1 thread", "raw_1t").replace("raw loop", "raw")
            if mode != "none" and (r := ratio(mode, raw, raw, "none")) is not None:
                headline[f"{key}_{mode}_over_quiet"] = round(r, 2)
            if (r := ratio(mode, "governor", raw)) is not None:
                headline[f"governor_over_{key}_{mode}"] = round(r, 2)
    return header + "\n" + table, headline


if __name__ == "__main__":
    sys.exit(main())
