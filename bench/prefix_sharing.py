"""Prefix sharing: 16 requests behind one 512-token system prompt, with and without the prefix
cache, in one run; then peak KV cells with block accounting against reserving the full context
per request (what llama.cpp's non-unified slots do).

The system prompt has been served once before the 16 arrive (a warm server); each request adds
its own question. KV cells are read from llama.cpp (seq_pos_min/max) between steps, not assumed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from engine import Engine

QUESTIONS = [f"Question {i}: what should a visitor to the old town see on day {i % 5 + 1}?"
             for i in range(64)]


def system_prompt_ids(engine: Engine, n_tokens: int) -> list[int]:
    text = ("You are the concierge of a small hotel in an old harbour town. Be concise, friendly "
            "and accurate; recommend walks, museums, bakeries and boat trips; mention opening "
            "hours and prices when you know them, and say so when you do not. ") * 40
    ids = engine.tokenize(text)
    if len(ids) < n_tokens:
        raise ValueError("system prompt text too short")
    return ids[:n_tokens]


def run_case(engine: Engine, system: list[int], n_requests: int, max_tokens: int) -> dict:
    engine.generate([system + engine.tokenize(" Warm-up question?", add_bos=False)], max_tokens=2)
    before = engine.stats()
    prompts = [system + engine.tokenize(" " + q, add_bos=False) for q in QUESTIONS[:n_requests]]
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], engine.kv_cells_in_use())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    start = time.perf_counter()
    watcher.start()
    results = engine.generate(prompts, max_tokens=max_tokens, ignore_eos=True)
    total = time.perf_counter() - start
    stop.set()
    watcher.join()
    after = engine.stats()
    return {
        "prefilled": after.tokens_prefilled - before.tokens_prefilled,
        "cached": sum(r.metrics.cached_tokens for r in results),
        "peak_cells": peak[0],
        "ttft_p50": statistics.median(r.metrics.ttft_ms for r in results),
        "ttft_max": max(r.metrics.ttft_ms for r in results),
        "total_s": total,
        "prompt_tokens": sum(r.metrics.prompt_tokens for r in results),
    }


def run(n_requests: int, system_tokens: int, max_tokens: int, n_ctx: int, threads: int, model: str | None,
        trials: int = 1, record: RunRecord | None = None) -> tuple[str, dict]:
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for trial in range(trials):
        # alternate which setting goes first: the machine's speed drifts within a run
        for cache in ((False, True) if trial % 2 == 0 else (True, False)):
            with Engine(model, n_ctx=n_ctx, max_running=n_requests, step_token_budget=512,
                        n_threads=threads, prefix_cache=cache) as engine:
                system = system_prompt_ids(engine, system_tokens)
                r = run_case(engine, system, n_requests, max_tokens)
            runs[cache].append(r)
            if record is not None:
                record.trial(trial=trial, prefix_cache=cache, **r)
            print(f"trial {trial} prefix cache {'on' if cache else 'off'}: total {r['total_s']:.1f} s, "
                  f"TTFT p50 {r['ttft_p50']:.0f} ms, peak cells {r['peak_cells']}", file=sys.stderr)
    med = {cache: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for cache, rs in runs.items()}
    # speed-up of each trial's cached run over its uncached one, then the median
    speedup = statistics.median(a["total_s"] / b["total_s"] for a, b in zip(runs[False], runs[True]))
    peaks = {cache: max(r["peak_cells"] for r in rs) for cache, rs in runs.items()}
    rows = []
    for cache in (False, True):
        m = med[cache]
        rows.append(["on" if cache else "off", m["prompt_tokens"], m["prefilled"], m["cached"], peaks[cache],
                     m["ttft_p50"], m["ttft_max"], m["total_s"]])
    table_a = markdown_table(
        ["prefix cache", "prompt tokens", "tokens prefilled", "tokens from cache", "peak KV cells",
         "TTFT p50 ms", "TTFT max ms", "total s"], rows)
    table_a = (f"{trials} trial(s), alternating which setting runs first; medians over trials, peak "
               f"cells the highest of any trial. Total time, uncached over cached, median of each "
               f"trial's ratio: {speedup:.1f}x.\n\n{table_a}")
    per_request = system_tokens + 20 + max_tokens
    # llama-server -np N without -kvu splits n_ctx into N fixed slots, each reserved for its
    # request whatever it uses: all n_ctx cells are committed while N requests run.
    reserve_full = n_ctx
    slot_rows = [
        [f"{n_requests} fixed slots of {n_ctx // n_requests} cells (non-unified)", reserve_full, "-"],
        ["ledger, no prefix cache (measured peak)", peaks[False], f"{1 - peaks[False] / reserve_full:.0%}"],
        ["ledger + prefix cache (measured peak)", peaks[True], f"{1 - peaks[True] / reserve_full:.0%}"],
    ]
    table_b = markdown_table(["KV reservation", "cells", "reduction vs fixed slots"], slot_rows)
    headline = {"peak_cells_no_cache": peaks[False], "peak_cells_cache": peaks[True],
                "reduction_vs_fixed_slots": round(1 - peaks[True] / reserve_full, 3),
                "total_speedup_with_cache": round(speedup, 2)}
    return (f"{n_requests} requests, {system_tokens}-token shared system prompt, {max_tokens} tokens "
            f"each (about {per_request} tokens per request), n_ctx {n_ctx}\n\n{table_a}\n\n{table_b}"), headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench prefix-sharing", description=__doc__)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--system-tokens", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--n-ctx", type=int, default=16384)
    add_common_arguments(parser, trials=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.system_tokens, args.tokens, args.n_ctx, args.trials = 4, 64, 4, 1024, 1
    record = RunRecord("prefix-sharing", args, args.model, argv)
    publish(record, *run(args.requests, args.system_tokens, args.tokens, args.n_ctx, args.threads, args.model,
                         args.trials, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
