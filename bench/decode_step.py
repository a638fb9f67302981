"""Decode-step micro-benchmark: the engine against a raw llama_decode + argmax loop, same process.

For each batch size B, both run the same B prompts and generate the same number of tokens; only
steps in which every row is a generating sequence are timed (prefill is excluded for both).
The engine's step time is split into its verbs: schedule, build batch, decode, sample, postprocess.
The engine runs with its prefix cache off by default: cached prefixes keep cells in the unified
cache, and llama.cpp's attention spans every used cell, which is a cost of caching (measured by
the prefix-sharing benchmark), not of the step loop this benchmark isolates.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from bench.prompts import benchmark_prompts
from bench.raw_loop import raw_loop_context, run_raw_loop
from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from engine import Engine
from engine.stats import PHASES

SAMPLING = {
    "greedy": {},
    "sampled": {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 1},
}


def engine_run(engine: Engine, prompts: list[str], n_generate: int, sampling: dict) -> dict:
    engine.profile(reset=True)
    handles = [engine.submit(p, max_tokens=n_generate, ignore_eos=True, **sampling) for p in prompts]
    for h in handles:
        h.result()
    decode = engine.profile()["decode"]
    per_step = decode.per_step_ms()
    return {"tok_s": decode.tokens_per_second, "steps": decode.steps, **{f"{p}_ms": per_step[p] for p in PHASES}}


def run(batch_sizes: list[int], n_generate: int, trials: int, threads: int, model_path: str | None,
        prefix_cache: bool = False, record: RunRecord | None = None) -> tuple[str, dict]:
    engine = Engine(model_path, n_threads=threads, max_running=max(batch_sizes), n_ctx=4096,
                    step_token_budget=512, prefix_cache=prefix_cache)
    raw_ctx = raw_loop_context(engine.model, max(batch_sizes), threads)
    rows = []
    try:
        prompts_all = benchmark_prompts(max(batch_sizes))
        token_prompts = [engine.tokenize(p) for p in prompts_all]
        # Warm-up for both: first decodes fault in the KV buffers and allocate compute graphs.
        engine_run(engine, prompts_all, n_generate, {})
        run_raw_loop(engine.model, token_prompts, n_generate, context=raw_ctx)
        for b in batch_sizes:
            raw, eng = {"greedy": []}, []
            for _ in range(trials):  # interleaved, so drifts in machine speed hit both alike
                r = run_raw_loop(engine.model, token_prompts[:b], n_generate, context=raw_ctx)
                raw["greedy"].append(b * r.steps / r.decode_seconds)
                eng.append({mode: engine_run(engine, prompts_all[:b], n_generate, cfg)
                            for mode, cfg in SAMPLING.items()})
                if record is not None:
                    record.trial(batch=b, raw_loop_tok_s=raw["greedy"][-1], **eng[-1])
            raw_tps = statistics.median(raw["greedy"])
            g = _median_run([e["greedy"] for e in eng])
            s = _median_run([e["sampled"] for e in eng])
            rows.append([b, raw_tps, g["tok_s"], g["tok_s"] / raw_tps, s["tok_s"], s["tok_s"] / raw_tps,
                         b * 1000 / raw_tps, g["decode_ms"], g["schedule_ms"] + g["build_batch_ms"],
                         g["sample_ms"], s["sample_ms"], g["postprocess_ms"]])
    finally:
        raw_ctx.close()
        engine.close()
    headline = {f"greedy_ratio_b{r[0]}": round(r[3], 3) for r in rows}
    headline.update({f"sampled_ratio_b{r[0]}": round(r[5], 3) for r in rows})
    return markdown_table(
        ["B", "raw loop tok/s", "engine greedy tok/s", "ratio", "engine sampled tok/s", "ratio",
         "raw ms/step", "engine decode ms/step", "schedule+build ms", "sample ms (greedy)",
         "sample ms (sampled)", "postprocess ms"],
        rows,
    ), headline


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench decode-step", description=__doc__)
    parser.add_argument("--batch-sizes", default="1,4,8,16,32")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--prefix-cache", action="store_true", help="run the engine with its prefix cache on")
    add_common_arguments(parser, trials=3)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    if args.quick:
        sizes, args.tokens, args.trials = [1, 4], 6, 1
    record = RunRecord("decode-step", args, args.model, argv)
    table, headline = run(sizes, args.tokens, args.trials, args.threads, args.model, args.prefix_cache, record)
    publish(record, table, headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
