"""Sequential vs continuous batching: one set of requests served one at a time by llama-cpp-python's
high-level `Llama.create_completion` (what its users run today) and by cobatch at several
concurrencies, in the same process; plus the decode ceiling measured in the same run by the raw
llama_decode loop and, when it is on PATH or given, llama.cpp's llama-batched-bench.

Every request generates exactly --tokens tokens (end-of-generation tokens are banned for the
baseline and ignored by cobatch), with the same sampling (T 0.7, top-k 40, top-p 0.9, no min-p).
cobatch runs closed-loop: C clients each keep one request in flight. For the sequential
baseline, latency at concurrency C is that of a one-at-a-time server with C clients waiting on
it: each request's measured service time plus the service times queued ahead of it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.stats import percentile
from bindings.library import llama_cpp_version
from bench.peer import batched_bench_tg, find_tool
from bench.prompts import benchmark_prompts
from bench.raw_loop import raw_loop_context, run_raw_loop
from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from engine import Engine
from engine.model_source import resolve_model

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9}


def sequential_service_times(model_path: str, prompts: list[str], tokens: int, threads: int,
                             banned: frozenset[int]) -> tuple[list[float], int]:
    from bindings.high_level import SequentialLlama

    llama = SequentialLlama(model_path, n_ctx=4096, n_threads=threads)
    try:
        llama.complete("Warm-up.", max_tokens=4, min_p=0.0, **SAMPLING)
        times, generated = [], 0
        for i, prompt in enumerate(prompts):
            start = time.perf_counter()
            generated += llama.complete(prompt, tokens, banned, seed=i, min_p=0.0, **SAMPLING)
            times.append(time.perf_counter() - start)
        return times, generated
    finally:
        llama.close()


def queued_latencies(service: list[float], clients: int) -> list[float]:
    """Latencies of a one-at-a-time server with `clients` closed-loop clients (FIFO)."""
    free_at, client_ready, latencies = 0.0, [0.0] * clients, []
    for i, s in enumerate(service):
        c = i % clients
        start = max(free_at, client_ready[c])
        free_at = start + s
        latencies.append(free_at - client_ready[c])
        client_ready[c] = free_at
    return latencies


def cobatch_closed_loop(engine: Engine, prompts: list[str], tokens: int, clients: int) -> dict:
    pending = list(enumerate(prompts))
    in_flight, latencies, generated = [], [], 0
    start = time.perf_counter()
    while pending or in_flight:
        while pending and len(in_flight) < clients:
            i, prompt = pending.pop(0)
            in_flight.append(engine.submit(prompt, max_tokens=tokens, ignore_eos=True, seed=i, **SAMPLING))
        time.sleep(0.002)
        for handle in [h for h in in_flight if h.done()]:
            in_flight.remove(handle)
            result = handle.result()
            latencies.append(result.metrics.latency_ms / 1000)
            generated += len(result.token_ids)
    elapsed = time.perf_counter() - start
    return {"tok_s": generated / elapsed, "latency_p50": statistics.median(latencies),
            "latency_p95": percentile(latencies, 95), "seconds": elapsed}


def run(args: argparse.Namespace, record: RunRecord) -> tuple[str, dict]:
    model_path = str(resolve_model(args.model))
    prompts = benchmark_prompts(args.requests)
    levels = [int(c) for c in args.concurrency.split(",")]
    engine = Engine(model_path, n_threads=args.threads, max_running=max(levels), n_ctx=args.n_ctx)
    seq_runs: list[float] = []
    cobatch_runs: dict[int, list[dict]] = {c: [] for c in levels}
    raw_runs: dict[int, list[float]] = {c: [] for c in levels}
    try:
        banned = frozenset(engine.model.eog_tokens)
        engine.generate(["Warm-up."], max_tokens=4)
        raw_ctx = raw_loop_context(engine.model, max(levels), args.threads)
        token_prompts = [engine.tokenize(p) for p in benchmark_prompts(max(levels))]
        try:
            for trial in range(args.trials):  # whole trials back to back: the machine drifts
                service, seq_tokens = sequential_service_times(model_path, prompts, args.tokens, args.threads, banned)
                seq_runs.append(seq_tokens / sum(service))
                record.trial(trial=trial, system="sequential", service_s=service, tokens=seq_tokens,
                             tok_s=seq_runs[-1])
                for c in levels:
                    run = cobatch_closed_loop(engine, prompts, args.tokens, c)
                    cobatch_runs[c].append(run)
                    record.trial(trial=trial, system="cobatch", concurrency=c, **run)
                    r = run_raw_loop(engine.model, token_prompts[:c], 32, context=raw_ctx)
                    raw_runs[c].append(c * r.steps / r.decode_seconds)
                    record.trial(trial=trial, system="raw_loop", batch=c, tok_s=raw_runs[c][-1])
                    print(f"trial {trial} C={c}: cobatch {run['tok_s']:.1f} tok/s, raw loop "
                          f"{raw_runs[c][-1]:.1f}", file=sys.stderr)
        finally:
            raw_ctx.close()
    finally:
        engine.close()
    seq_tok_s = statistics.median(seq_runs)
    cobatch = {c: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for c, runs in cobatch_runs.items()}
    raw = {c: statistics.median(v) for c, v in raw_runs.items()}
    service = next(t["service_s"] for t in record.trials if t["system"] == "sequential")
    batched = {}
    tool = find_tool("llama-batched-bench", args.batched_bench_bin)
    if tool:
        batched = batched_bench_tg(tool, model_path, levels, args.threads)
        record.trial(system="llama-batched-bench", s_tg=batched)
    rows = []
    for c in levels:
        lat = queued_latencies(service, c)
        rows.append([c, seq_tok_s, percentile(lat, 95), cobatch[c]["tok_s"], cobatch[c]["latency_p95"],
                     cobatch[c]["tok_s"] / seq_tok_s, raw[c], cobatch[c]["tok_s"] / raw[c],
                     batched.get(c, "not run"),
                     cobatch[c]["tok_s"] / batched[c] if c in batched else "-"])
    table = markdown_table(
        ["C", "sequential Llama tok/s", "sequential p95 latency s", "cobatch tok/s", "cobatch p95 latency s",
         "cobatch / sequential", "raw loop tok/s (B=C)", "fraction of raw loop",
         "llama-batched-bench S_TG (B=C)", "fraction of batched-bench"], rows)
    top = max(levels)
    headline = {f"speedup_c{c}": round(cobatch[c]["tok_s"] / seq_tok_s, 2) for c in levels}
    headline["sequential_tok_s"] = round(seq_tok_s, 1)
    if top in batched:
        headline[f"fraction_of_batched_bench_c{top}"] = round(cobatch[top]["tok_s"] / batched[top], 2)
    summary = (f"{table}\n\n{args.requests} requests x {args.tokens} tokens, {args.threads} threads, "
               f"medians of {args.trials} trial(s); each level's raw loop runs right after it. "
               f"Sequential: llama-cpp-python {llama_cpp_version()} `Llama.create_completion`, one at a time.")
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench sequential", description=__doc__)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--concurrency", default="4,16,32")
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--batched-bench-bin", default=None,
                        help="llama-batched-bench (file or folder); default: PATH, else skipped")
    add_common_arguments(parser, trials=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.tokens, args.concurrency, args.n_ctx, args.trials = 4, 4, "2,4", 2048, 1
    record = RunRecord("sequential", args, args.model, argv)
    publish(record, *run(args, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
