"""Structured output overhead: constrained (JSON Schema) against unconstrained generation on the
same prompts and sampling settings, in one run, at B = 1 and 8; grammar compile time (first and
cached) and the sampler's time per step with and without masks.
"""
from __future__ import annotations

import argparse
import sys
import time

from bench.prompts import benchmark_prompts
from bench.schemas import REVIEW_SCHEMA as REVIEW
from bench.mask_timing import cobatch_mask_times, llguidance_mask_times
from bench.stats import percentile
from bench.record import RunRecord, add_record_arguments, publish
from bench.table import markdown_table
from engine import Engine
from sampling.grammar import compile_grammar

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9}


def measure(engine: Engine, prompts: list[str], max_tokens: int, schema: dict | None) -> dict:
    engine.profile(reset=True)
    extra = {"json_schema": schema} if schema else {"ignore_eos": True}
    start = time.perf_counter()
    results = engine.generate(prompts, max_tokens=max_tokens, seed=3, **SAMPLING, **extra)
    wall = time.perf_counter() - start
    decode = engine.profile()["decode"]
    return {
        "tok_s": decode.tokens_per_second,
        "sample_ms": decode.per_step_ms()["sample"],
        "step_ms": decode.total_seconds * 1000 / max(decode.steps, 1),
        "tokens": sum(r.metrics.tokens_generated for r in results),
        "wall_s": wall,
        "documents": [list(r.token_ids) for r in results] if schema else [],
    }


def mask_time_rows(engine: Engine, documents: list[list[int]], max_tokens: int,
                   record: RunRecord | None) -> list[list[object]]:
    def row(name: str, times: list[float], note: str) -> list[object]:
        us = [t * 1e6 for t in times]
        return [name, len(us), percentile(us, 50), percentile(us, 99), note]

    vocab = engine.vocabulary
    cold = cobatch_mask_times(REVIEW, vocab, documents, max_tokens, fresh=True)
    warm = cobatch_mask_times(REVIEW, vocab, documents, max_tokens)
    rows = [row("cobatch, fresh grammar", cold, "per-state caches empty at the start"),
            row("cobatch, warm grammar", warm, "the shared grammar after the runs above")]
    reference = llguidance_mask_times(REVIEW, vocab, documents)
    if reference is None:
        rows.append(["llguidance", 0, "-", "-", "not installed (pip install 'cobatch[bench]')"])
    else:
        rows.append(row("llguidance fill_next_token_bitmask", reference["times"],
                        f"compile {reference['compile_s'] * 1000:.1f} ms; {reference['refused']} replay(s) refused"))
    if record is not None:
        record.trial(mask_us={"cobatch_fresh": [t * 1e6 for t in cold], "cobatch_warm": [t * 1e6 for t in warm],
                              "llguidance": None if reference is None else [t * 1e6 for t in reference["times"]]})
    return rows


def run(batch_sizes: list[int], max_tokens: int, rounds: int, threads: int, model: str | None,
        record: RunRecord | None = None) -> tuple[str, dict]:
    with Engine(model, n_ctx=8192, max_batch=max(batch_sizes), n_threads=threads, step_token_budget=512) as engine:
        start = time.perf_counter()
        compile_grammar(REVIEW, engine.vocabulary)
        first_compile = time.perf_counter() - start
        start = time.perf_counter()
        compile_grammar(REVIEW, engine.vocabulary)
        cached_compile = time.perf_counter() - start
        rows = []
        for b in batch_sizes:
            prompts = [p + " Answer as a JSON product review." for p in benchmark_prompts(b)]
            measure(engine, prompts, max_tokens, REVIEW)  # warm-up: fills the grammar's mask cache
            free, bound = [], []
            for _ in range(rounds):
                free.append(measure(engine, prompts, max_tokens, None))
                bound.append(measure(engine, prompts, max_tokens, REVIEW))
                if record is not None:
                    record.trial(batch=b, unconstrained=free[-1], constrained=bound[-1])
            f = sorted(free, key=lambda r: r["tok_s"])[len(free) // 2]
            c = sorted(bound, key=lambda r: r["tok_s"])[len(bound) // 2]
            rows.append([b, f["tok_s"], c["tok_s"], c["tok_s"] / f["tok_s"], f["step_ms"], c["step_ms"],
                         f["sample_ms"], c["sample_ms"]])
        documents = [d for run in bound for d in run["documents"]]
        masks = mask_time_rows(engine, documents, max_tokens, record)
    table = markdown_table(
        ["B", "unconstrained tok/s", "constrained tok/s", "ratio", "step ms (free)", "step ms (JSON)",
         "sample ms/step (free)", "sample ms/step (JSON)"], rows)
    mask_table = markdown_table(["mask computation", "steps timed", "p50 µs", "p99 µs", "notes"], masks)
    table = f"{table}\n\nMask time per token, replaying the constrained outputs above:\n\n{mask_table}"
    headline = {f"ratio_b{r[0]}": round(r[3], 3) for r in rows}
    headline["compile_first_ms"] = round(first_compile * 1000)
    return (f"{table}\n\ngrammar compile (product-review schema, Gemma vocabulary): first "
            f"{first_compile * 1000:.0f} ms (includes the one-time vocabulary trie), cached "
            f"{cached_compile * 1000:.2f} ms"), headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench structured", description=__doc__)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--quick", action="store_true")
    add_record_arguments(parser)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    if args.quick:
        sizes, args.tokens, args.rounds = [1, 2], 16, 1
    record = RunRecord("structured", args, args.model, argv)
    publish(record, *run(sizes, args.tokens, args.rounds, args.threads, args.model, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
