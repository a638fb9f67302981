"""Decode-step micro-benchmark: the engine against a raw llama_decode + argmax loop, same process.

For each batch size B, both run the same B prompts and generate the same number of tokens; only
steps in which every row is a generating sequence are timed (prefill is excluded for both).
The engine's step time is split into its verbs: schedule, build batch, decode, sample, postprocess.
The engine runs with its prefix cache off by default: cached prefixes keep cells in the unified
cache, and llama.cpp's attention spans every used cell, which is a cost of caching (measured by
the prefix-sharing benchmark), not of the step loop this benchmark isolates.

`--speculative-off-too` adds a second engine with speculative decoding off, run in the same
trials, interleaved, which engine goes first alternating: what speculation costs (or gains) the
step at each B, apart from the machine's drift between runs.
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
        prefix_cache: bool = False, record: RunRecord | None = None,
        speculative_off_too: bool = False) -> tuple[str, dict]:
    settings = dict(n_threads=threads, max_running=max(batch_sizes), n_ctx=4096, step_token_budget=512,
                    prefix_cache=prefix_cache)
    engine = Engine(model_path, **settings)
    plain = Engine(model_path, **settings, speculative=False) if speculative_off_too else None
    raw_ctx = raw_loop_context(engine.model, max(batch_sizes), threads)
    rows, off_rows = [], []
    try:
        prompts_all = benchmark_prompts(max(batch_sizes))
        token_prompts = [engine.tokenize(p) for p in prompts_all]
        # Warm-up for all: first decodes fault in the KV buffers and allocate compute graphs.
        engine_run(engine, prompts_all, n_generate, {})
        if plain is not None:
            engine_run(plain, prompts_all, n_generate, {})
        run_raw_loop(engine.model, token_prompts, n_generate, context=raw_ctx)
        for b in batch_sizes:
            raw, eng, off = {"greedy": []}, [], []
            for trial in range(trials):  # interleaved, so drifts in machine speed hit both alike
                r = run_raw_loop(engine.model, token_prompts[:b], n_generate, context=raw_ctx)
                raw["greedy"].append(b * r.steps / r.decode_seconds)
                # With two engines, which goes first alternates: a fixed order would hand one of
                # them whatever the one before it leaves on the cores.
                order = [(eng, engine)] + ([(off, plain)] if plain is not None else [])
                for runs, runner in (order if trial % 2 == 0 else order[::-1]):
                    runs.append({mode: engine_run(runner, prompts_all[:b], n_generate, cfg)
                                 for mode, cfg in SAMPLING.items()})
                if record is not None:
                    extra = {f"speculative_off_{m}": v for m, v in off[-1].items()} if off else {}
                    record.trial(batch=b, raw_loop_tok_s=raw["greedy"][-1], **eng[-1], **extra)
            raw_tps = statistics.median(raw["greedy"])
            g = _median_run([e["greedy"] for e in eng])
            s = _median_run([e["sampled"] for e in eng])
            rows.append([b, raw_tps, g["tok_s"], g["tok_s"] / raw_tps, s["tok_s"], s["tok_s"] / raw_tps,
                         b * 1000 / raw_tps, g["decode_ms"], g["schedule_ms"] + g["build_batch_ms"],
                         g["sample_ms"], s["sample_ms"], g["postprocess_ms"]])
            if off:
                off_rows.append([b] + [x for mode in SAMPLING for x in _auto_over_off(eng, off, mode)])
    finally:
        raw_ctx.close()
        engine.close()
        if plain is not None:
            plain.close()
    headline = {f"greedy_ratio_b{r[0]}": round(r[3], 3) for r in rows}
    headline.update({f"sampled_ratio_b{r[0]}": round(r[5], 3) for r in rows})
    headline.update({f"{mode}_auto_over_off_b{r[0]}": round(r[3 + 3 * i], 3)
                     for r in off_rows for i, mode in enumerate(SAMPLING)})
    table = markdown_table(
        ["B", "raw loop tok/s", "engine greedy tok/s", "ratio", "engine sampled tok/s", "ratio",
         "raw ms/step", "engine decode ms/step", "schedule+build ms", "sample ms (greedy)",
         "sample ms (sampled)", "postprocess ms"],
        rows,
    )
    if off_rows:
        table += "\n\nSpeculation on (the engine above) against off, same trials; ratios: median of each trial's.\n\n" + markdown_table(
            ["B"] + [f"{mode} {col}" for mode in SAMPLING for col in ("auto tok/s", "off tok/s", "auto / off")], off_rows)
    return table, headline


def _auto_over_off(auto: list[dict], off: list[dict], mode: str) -> list[float]:
    """Median tok/s of each, and the median of the trials' ratios."""
    return [statistics.median(a[mode]["tok_s"] for a in auto), statistics.median(o[mode]["tok_s"] for o in off),
            statistics.median(a[mode]["tok_s"] / o[mode]["tok_s"] for a, o in zip(auto, off))]


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench decode-step", description=__doc__)
    parser.add_argument("--batch-sizes", default="1,4,8,16,32")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--prefix-cache", action="store_true", help="run the engine with its prefix cache on")
    parser.add_argument("--speculative-off-too", action="store_true",
                        help="also run an engine with speculative decoding off, in the same trials")
    add_common_arguments(parser, trials=3)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    if args.quick:
        sizes, args.tokens, args.trials = [1, 4], 6, 1
    record = RunRecord("decode-step", args, args.model, argv)
    table, headline = run(sizes, args.tokens, args.trials, args.threads, args.model, args.prefix_cache, record,
                          args.speculative_off_too)
    publish(record, table, headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
