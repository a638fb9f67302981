"""Mixed priorities through HTTP, with and without a busy neighbour: `cobatch serve` (priority on,
and FIFO) and llama-server, each in its own process, under a batch flood with interactive arrivals.

Each trial, for each neighbour mode (bench/neighbour.py; default: none, then nice19-session, a
nice-19 busy loop in a session of its own, which this kernel's autogroups let compete at full
weight), every server runs, in an order alternating between trials:
  idle       6 interactive requests (32 tokens, streamed) one at a time: TTFT and end-to-end p50;
  flood      24 batch requests x 256 tokens sent at once, and an interactive request every 5 s
             until the flood has finished.
Every request ignores end-of-generation, so all servers do the same work. cobatch serve sends
the flood as `priority: batch` and the arrivals as `interactive`; its FIFO twin (`--no-priority`)
and llama-server (no priority at all, `-np 32 -kvu -fa on`) get the same requests as one class.

Targets, per trial, for cobatch with priority: interactive TTFT p95 <= 2.5x its idle TTFT p50,
interactive end-to-end p95 <= 3x its idle end-to-end p50, flood tok/s >= 0.85x FIFO's in the
same trial and mode. A flood still running after --flood-limit seconds is reported as
collapsed, with the requests it finished.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from typing import Any

import httpx

from bench.http_targets import Cobatch, LlamaCpp, Sample, SpawnedServer, Target
from bench.prompts import QUESTIONS
from bench.neighbour import MODES, neighbour
from bench.peer import add_peer_arguments, llama_server, peer_binary
from bench.record import RunRecord, add_common_arguments, publish_report
from bench.stats import percentile
from bench.table import markdown_table
from engine.config import EngineConfig
from engine.model_source import resolve_model


def flood_prompts(n: int) -> list[str]:
    return [f"Write a long, detailed story about lighthouse keeper number {i} and the storm." for i in range(n)]


async def idle(target: Target, n: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0)) as client:
        samples = [await target.one(client, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]
    ok = _ok(samples)
    return {"idle_ttft_p50": percentile([s.ttft_s * 1000 for s in ok], 50),
            "idle_e2e_p50": percentile([s.latency_s * 1000 for s in ok], 50),
            "idle_itl_p95": _gap_p95(ok)}


def _gap_p95(samples: list[Sample]) -> float:
    """p95 of every interval between streamed text events (about one per token), in ms."""
    gaps = [g * 1000 for s in samples for g in s.gaps_s]
    return percentile(gaps, 95) if gaps else float("nan")


async def flood(batch: Target, interactive: Target, n_batch: int, every_s: float, limit_s: float) -> dict[str, Any]:
    """The flood and its interactive arrivals. A flood still running after `limit_s` has
    collapsed: it is cancelled, and its tok/s counts the requests that finished by then."""
    limits = httpx.Limits(max_connections=n_batch + 64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=30.0), limits=limits) as client:
        start = time.perf_counter()
        flood_tasks = [asyncio.create_task(batch.one(client, p)) for p in flood_prompts(n_batch)]
        arrivals: list[asyncio.Task] = []
        next_arrival = start + every_s
        while not all(t.done() for t in flood_tasks) and time.perf_counter() - start < limit_s:
            if time.perf_counter() >= next_arrival:
                question = QUESTIONS[len(arrivals) % len(QUESTIONS)]
                arrivals.append(asyncio.create_task(interactive.one(client, question)))
                next_arrival += every_s
            await asyncio.sleep(0.01)
        makespan = time.perf_counter() - start
        done = [t for t in flood_tasks if t.done()]
        for t in flood_tasks + arrivals:
            if not t.done():
                t.cancel()
        await asyncio.gather(*flood_tasks, *arrivals, return_exceptions=True)
        flood_samples = _ok([t.result() for t in done])
        answers = _ok([t.result() for t in arrivals if t.done() and not t.cancelled()])
    ttft = [s.ttft_s * 1000 for s in answers]
    e2e = [s.latency_s * 1000 for s in answers]
    return {"batch_tok_s": sum(s.tokens for s in flood_samples) / makespan, "makespan_s": makespan,
            "collapsed": len(done) < n_batch, "batch_done": len(done), "interactive_n": len(answers),
            "ttft_p95": percentile(ttft, 95) if ttft else float("nan"),
            "e2e_p95": percentile(e2e, 95) if e2e else float("nan"), "itl_p95": _gap_p95(answers)}


def _ok(samples: list[Sample]) -> list[Sample]:
    failed = [s for s in samples if not s.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} request(s) failed; first: {failed[0].error}")
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench mixed-priority --http", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--neighbour", default="none,nice19-session",
                        help=f"comma-separated modes among {', '.join(MODES)}")
    parser.add_argument("--batch", type=int, default=24, help="batch requests in the flood")
    parser.add_argument("--batch-tokens", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per interactive request")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between interactive arrivals")
    parser.add_argument("--idle", type=int, default=6, help="interactive requests for the idle reference")
    parser.add_argument("--flood-limit", type=float, default=300.0,
                        help="seconds after which a flood counts as collapsed and is cancelled")
    parser.add_argument("--interactive-batch-rows", default="",
                        help="comma-separated bounds (0: none): one more `cobatch serve` with priority per "
                             "value, to weigh interactive per-token latency against flood throughput")
    add_common_arguments(parser, trials=3)
    add_peer_arguments(parser)
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.neighbour.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--neighbour: choose among {', '.join(MODES)}")
    if args.quick:
        args.batch, args.batch_tokens, args.tokens, args.every, args.idle, args.trials = 2, 8, 4, 0.3, 1, 1
        modes = modes[:1]
    binary = peer_binary(args)
    n_ctx = max(4096, (args.batch + 8) * (args.batch_tokens + 64))
    try:
        bounds = [int(x) for x in args.interactive_batch_rows.split(",") if x.strip()]
    except ValueError:
        parser.error("--interactive-batch-rows: comma-separated integers")
    servers = {"priority": SpawnedServer(args.model, args.threads, 32, n_ctx),
               **{f"priority rows={b or 'any'}": SpawnedServer(args.model, args.threads, 32, n_ctx,
                                                            ["--interactive-batch-rows", str(b)]) for b in bounds},
               "fifo": SpawnedServer(args.model, args.threads, 32, n_ctx, ["--no-priority"])}
    record = RunRecord("mixed-priority", args, args.model, ["--http", *(sys.argv[2:] if argv is None else argv)])
    rows: list[dict[str, Any]] = []
    try:
        with contextlib.ExitStack() as running:
            for server in servers.values():
                running.enter_context(server)
            peer_url = running.enter_context(
                llama_server(binary, str(resolve_model(args.model)), args.threads, 32, n_ctx, extra_args=["-fa", "on"])
                if binary else contextlib.nullcontext(None))
            targets: dict[str, tuple[Target, Target]] = {
                name: (Cobatch(server.url, args.batch_tokens, True, "batch"),
                       Cobatch(server.url, args.tokens, True, "interactive"))
                for name, server in servers.items() if name != "fifo"}
            targets["fifo"] = (Cobatch(servers["fifo"].url, args.batch_tokens, True),
                               Cobatch(servers["fifo"].url, args.tokens, True))
            if peer_url:
                targets["llama-server"] = (LlamaCpp(peer_url, args.batch_tokens, True),
                                           LlamaCpp(peer_url, args.tokens, True))
            for trial in range(args.trials):
                for mode in modes:
                    order = list(targets) if trial % 2 == 0 else list(reversed(targets))
                    with neighbour(mode):
                        for name in order:
                            batch, interactive = targets[name]
                            row = {"trial": trial, "neighbour": mode, "server": name,
                                   **asyncio.run(idle(interactive, args.idle)),
                                   **asyncio.run(flood(batch, interactive, args.batch, args.every, args.flood_limit))}
                            rows.append(row)
                            record.trial(**row)
                            print(f"trial {trial} {mode} {name}: flood {row['batch_tok_s']:.1f} tok/s, "
                                  f"TTFT p95 {row['ttft_p95']:.0f} ms (idle p50 {row['idle_ttft_p50']:.0f}), "
                                  f"e2e p95 {row['e2e_p95']:.0f} ms (idle p50 {row['idle_e2e_p50']:.0f})",
                                  file=sys.stderr)
    except (RuntimeError, OSError) as exc:
        print(f"mixed-priority --http: {exc}", file=sys.stderr)
        return 1
    publish_report(record, lambda: report(rows, modes))
    return 0


def report(rows: list[dict[str, Any]], modes: list[str]) -> tuple[str, dict]:
    names = list(dict.fromkeys(r["server"] for r in rows))
    trials = sorted({r["trial"] for r in rows})
    get = {(r["trial"], r["neighbour"], r["server"]): r for r in rows}
    table, checks, headline = [], [], {}
    for mode in modes:
        for name in names:
            mine = [get[(t, mode, name)] for t in trials]
            med = lambda k: statistics.median(r.get(k, float("nan")) for r in mine)  # noqa: E731
            table.append([mode, name, med("batch_tok_s"), med("idle_ttft_p50"), med("ttft_p95"),
                          statistics.median(r["ttft_p95"] / r["idle_ttft_p50"] for r in mine),
                          med("idle_e2e_p50"), med("e2e_p95"),
                          statistics.median(r["e2e_p95"] / r["idle_e2e_p50"] for r in mine),
                          med("idle_itl_p95"), med("itl_p95")])
        passed = 0
        for t, variant in ((t, v) for v in names if v.startswith("priority") for t in trials):
            prio, fifo = get[(t, mode, variant)], get[(t, mode, "fifo")]
            ttft_x = prio["ttft_p95"] / prio["idle_ttft_p50"]
            e2e_x = prio["e2e_p95"] / prio["idle_e2e_p50"]
            share = prio["batch_tok_s"] / fifo["batch_tok_s"] if fifo["batch_tok_s"] > 0 else float("inf")
            missed = [what for what, bad in (("TTFT", not ttft_x <= 2.5), ("end-to-end", not e2e_x <= 3.0),
                                             ("flood", share < 0.85), ("collapsed", prio["collapsed"])) if bad]
            passed += not missed and variant == "priority"
            line = (f"- {mode}, {variant}, trial {t}: TTFT p95 {ttft_x:.2f}x idle p50, end-to-end p95 {e2e_x:.2f}x, "
                    f"flood {share:.2f}x FIFO's, inter-token p95 {prio.get('itl_p95', float('nan')):.0f} ms (target "
                    f"{EngineConfig.interactive_token_ms:.0f}; {prio.get('idle_itl_p95', float('nan')):.0f} with "
                    f"nothing else running)")
            if "llama-server" in names:
                peer = get[(t, mode, "llama-server")]
                if peer["batch_tok_s"] > 0:
                    line += f", {prio['batch_tok_s'] / peer['batch_tok_s']:.2f}x llama-server's"
                if peer["collapsed"]:
                    line += (f" (llama-server's flood collapsed: {peer['batch_done']} of its requests done "
                             f"in {peer['makespan_s']:.0f} s)")
            checks.append(line + (f": missed {', '.join(missed)}" if missed else ": all met"))
        headline[f"trials_met_{mode}"] = f"{passed}/{len(trials)}"
    summary = "\n".join([
        f"{len(trials)} trial(s) per neighbour mode; medians over trials. Targets per trial (cobatch with "
        f"priority): interactive TTFT p95 <= 2.5x idle TTFT p50, end-to-end p95 <= 3x idle end-to-end p50, "
        f"flood tok/s >= 0.85x FIFO's.", "",
        markdown_table(["neighbour", "server", "flood tok/s", "idle TTFT p50 ms", "TTFT p95 ms", "TTFT p95 / idle",
                        "idle e2e p50 ms", "e2e p95 ms", "e2e p95 / idle", "idle inter-token p95 ms",
                        "inter-token p95 ms"], table), "", *checks])
    return summary, headline
