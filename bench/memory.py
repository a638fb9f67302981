"""Memory: KV cells and process memory while C requests run together, block accounting against
fixed per-request slots, in one run.

For each concurrency C, C requests (bench/prompts.py, temperature 0.7, top-k 40, top-p 0.9)
are submitted together to one engine, prefix cache off so nothing is held from one level to
the next. Like real traffic they ask for different lengths: request i may generate
(i mod 8 + 1)/8 of --max-tokens, and stops earlier at end-of-generation. A watcher thread
samples, every 5 ms, the KV cells in use (read from llama.cpp) and the process resident set
size (/proc/self/status).

Baseline, from the same requests: a slot server (llama-server -np C -c N without -kvu) gives
every slot N/C cells before it knows which request lands there or how long its answer will be,
so N/C must cover the longest prompt plus --max-tokens, and it reserves C times that while the
level runs. Block accounting reserves what each sequence has used, rounded up to its 16-token
block.

Bytes per KV cell are measured from llama.cpp, not computed from the model's shape: the state
size (llama_state_seq_get_size) of two sequences of different lengths, divided by the
difference in cells.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from bench.prompts import benchmark_prompts
from bench.raw_loop import decode_or_raise, raw_loop_context
from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from bindings import TokenBatch, Model
from engine import Engine
from engine.model_source import resolve_model

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9}
MIB = 1024 * 1024


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def kv_bytes_per_cell(model: Model, threads: int, short: int = 64, long: int = 320) -> float:
    """Slope of llama.cpp's per-sequence state size between a short and a long sequence."""
    text = " ".join(benchmark_prompts(64))
    ids = model.tokenize(text, add_bos=True)
    if len(ids) < long:
        raise RuntimeError("not enough prompt text to measure a KV cell")
    with raw_loop_context(model, 2, threads, n_ctx=1024, batch_rows=short + long) as ctx:
        batch = TokenBatch(short + long)
        batch.add_run(ids[:short], 0, 0, logits_last=True)
        batch.add_run(ids[:long], 0, 1, logits_last=True)
        decode_or_raise(ctx, batch)
        return (ctx.sequence_state_bytes(1) - ctx.sequence_state_bytes(0)) / (long - short)


def requested_lengths(concurrency: int, max_tokens: int) -> list[int]:
    return [max(1, max_tokens * (i % 8 + 1) // 8) for i in range(concurrency)]


def run_level(engine: Engine, concurrency: int, max_tokens: int, seed: int) -> dict:
    prompts = benchmark_prompts(concurrency)
    lengths = requested_lengths(concurrency, max_tokens)
    prompt_tokens = [len(engine.tokenize(p)) for p in prompts]
    peak = {"cells": 0, "rss": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak["cells"] = max(peak["cells"], engine.kv_cells_in_use())
            peak["rss"] = max(peak["rss"], resident_bytes())
            time.sleep(0.005)

    rss_before = resident_bytes()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        handles = [engine.submit(p, max_tokens=n, seed=seed, **SAMPLING) for p, n in zip(prompts, lengths)]
        results = [h.result() for h in handles]
    finally:
        stop.set()
        watcher.join()
    return {
        "concurrency": concurrency,
        "requested": lengths,
        "generated": [r.metrics.tokens_generated for r in results],
        "prompt_tokens": prompt_tokens,
        "peak_cells": peak["cells"],
        "slot_cells": concurrency * (max(prompt_tokens) + max_tokens),
        "cells_after": engine.kv_cells_in_use(),
        "rss_before": rss_before,
        "rss_peak": peak["rss"],
        "rss_after": resident_bytes(),
    }


def run(args: argparse.Namespace, record: RunRecord) -> tuple[str, dict]:
    levels = [int(c) for c in args.concurrency.split(",")]
    model_path = str(resolve_model(args.model))
    with Model(model_path) as model:
        per_cell = kv_bytes_per_cell(model, args.threads)
    record.trial(kv_bytes_per_cell=per_cell)
    runs: dict[int, list[dict]] = {c: [] for c in levels}
    with Engine(model_path, n_threads=args.threads, max_running=max(levels), n_ctx=args.n_ctx,
                prefix_cache=False) as engine:
        engine.generate(["Warm-up."], max_tokens=4)
        rss_loaded = resident_bytes()
        for trial in range(args.trials):
            for c in levels:
                r = run_level(engine, c, args.max_tokens, seed=trial)
                runs[c].append(r)
                record.trial(trial=trial, **r)
                print(f"trial {trial} C={c}: peak {r['peak_cells']} cells against {r['slot_cells']} in slots, "
                      f"RSS peak {r['rss_peak'] / MIB:.0f} MiB", file=sys.stderr)
        n_ctx = engine.config.n_ctx
    rows = []
    for c in levels:
        rs = runs[c]
        peak = statistics.median(r["peak_cells"] for r in rs)
        slots = statistics.median(r["slot_cells"] for r in rs)
        mean_generated = statistics.mean(g for r in rs for g in r["generated"])
        rows.append([c, mean_generated, slots, slots * per_cell / MIB, peak, peak * per_cell / MIB,
                     f"{1 - peak / slots:.0%}", max(r["cells_after"] for r in rs),
                     statistics.median(r["rss_before"] for r in rs) / MIB,
                     statistics.median(r["rss_peak"] for r in rs) / MIB,
                     statistics.median(r["rss_after"] for r in rs) / MIB])
    table = markdown_table(
        ["C", "mean tokens generated", "fixed slots: cells", "fixed slots: KV MiB", "block ledger: peak cells",
         "block ledger: KV MiB", "reduction", "cells held after", "RSS before MiB", "RSS peak MiB",
         "RSS after MiB"], rows)
    top = max(levels)
    headline = {f"reduction_c{top}": round(1 - rows[-1][4] / rows[-1][2], 3),
                "kv_bytes_per_cell": round(per_cell), "rss_loaded_mib": round(rss_loaded / MIB)}
    summary = (f"{table}\n\nRequest i asks for (i mod 8 + 1)/8 of {args.max_tokens} tokens and stops earlier at "
               f"end-of-generation; fixed slots are sized for the longest prompt plus {args.max_tokens}; "
               f"{args.trials} trial(s), medians. KV cell: {per_cell:.0f} bytes, measured from llama.cpp. "
               f"The context's whole KV buffer ({n_ctx} cells, {n_ctx * per_cell / MIB:.0f} MiB) is "
               f"allocated when the engine starts; RSS after loading and warm-up: {rss_loaded / MIB:.0f} MiB. "
               f"Fewer cells in use mean more requests fit in the same buffer, or a smaller buffer for "
               f"the same load (--n-ctx).")
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8,16,32")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--n-ctx", type=int, default=16384)
    add_common_arguments(parser, trials=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.max_tokens, args.n_ctx, args.trials = "1,2", 8, 1024, 1
    record = RunRecord("memory", args, args.model, argv)
    publish(record, *run(args, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
