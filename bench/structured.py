"""Structured output overhead: constrained (JSON Schema) against unconstrained generation on the
same prompts and sampling settings, in one run, at B = 1 and 8; grammar compile time (first and
cached) and the sampler's time per step with and without masks.

The unconstrained baseline generates, for every prompt, exactly as many tokens as the latest
constrained run did (ignoring end-of-generation). A JSON document ends when it
is complete, so constrained requests finish at different steps and the last steps run with fewer
rows; a baseline that always ran --tokens tokens would keep every row to the end and so batch
better, which is not what a mask costs. With equal lengths both runs decode the same rows at
every step, and the difference is the grammar's own work. Ratios are taken within each round
(the machine's speed drifts), then their median. Because llama_decode's time swings by tens of
percent between runs on a busy machine, the table also gives the engine's own time per step
outside llama_decode, which is the only place a mask can add time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.prompts import benchmark_prompts
from bench.schemas import REVIEW_SCHEMA as REVIEW
from bench.mask_timing import cobatch_mask_times, llguidance_mask_times
from bench.stats import percentile
from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from engine import Engine
from engine.request import Request
from sampling.grammar import compile_grammar
from sampling.params import SamplingParams

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9}


def measure(engine: Engine, prompts: list[str], lengths: list[int], schema: dict | None) -> dict:
    """One round: with a schema, each prompt up to its length; without, exactly its length."""
    engine.profile(reset=True)
    requests = [Request(prompt=p, max_tokens=n, sampling=SamplingParams(seed=3, **SAMPLING),
                        **({"format": "json", "json_schema": schema} if schema else {"ignore_eos": True}))
                for p, n in zip(prompts, lengths)]
    start = time.perf_counter()
    results = [h.result() for h in engine.submit_many(requests)]
    wall = time.perf_counter() - start
    decode = engine.profile()["decode"]
    return {
        "tok_s": decode.tokens_per_second,
        "sample_ms": decode.per_step_ms()["sample"],
        # everything but llama_decode: scheduling, batch building, sampling with masks, grammar
        # advance; the only time the grammar can add, since llama_decode never sees it
        "engine_ms": sum(v for k, v in decode.per_step_ms().items() if k != "decode"),
        "step_ms": decode.total_seconds * 1000 / max(decode.steps, 1),
        "tokens": sum(r.metrics.tokens_generated for r in results),
        "lengths": [r.metrics.tokens_generated for r in results],
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
            budget = [max_tokens] * len(prompts)
            lengths = measure(engine, prompts, budget, REVIEW)["lengths"]  # warm-up: fills the mask cache
            free, bound, ratios = [], [], []
            for i in range(rounds):
                # alternate which mode goes first, so a drift in speed during a round cancels out
                for constrained in ((True, False) if i % 2 == 0 else (False, True)):
                    if constrained:
                        bound.append(measure(engine, prompts, budget, REVIEW))
                        lengths = bound[-1]["lengths"]
                    else:
                        free.append(measure(engine, prompts, [max(n, 1) for n in lengths], None))
                ratios.append(bound[-1]["tok_s"] / free[-1]["tok_s"])
                if record is not None:
                    record.trial(batch=b, unconstrained=free[-1], constrained=bound[-1], ratio=ratios[-1])
            keys = ("tok_s", "step_ms", "engine_ms", "sample_ms")
            f = {k: statistics.median(r[k] for r in free) for k in keys}
            c = {k: statistics.median(r[k] for r in bound) for k in keys}
            rows.append([b, f["tok_s"], c["tok_s"], statistics.median(ratios), f["step_ms"], c["step_ms"],
                         f["engine_ms"], c["engine_ms"], (c["engine_ms"] - f["engine_ms"]) / f["step_ms"]])
        documents = [d for run in bound for d in run["documents"]]
        masks = mask_time_rows(engine, documents, max_tokens, record)
    table = markdown_table(
        ["B", "unconstrained tok/s (same lengths)", "constrained tok/s", "ratio (median of rounds)",
         "step ms (free)", "step ms (JSON)", "engine ms/step (free)", "engine ms/step (JSON)",
         "grammar's share of a step"], rows)
    mask_table = markdown_table(["mask computation", "steps timed", "p50 µs", "p99 µs", "notes"], masks)
    table = f"{table}\n\nMask time per token, replaying the constrained outputs above:\n\n{mask_table}"
    headline = {f"ratio_b{r[0]}": round(r[3], 3) for r in rows}
    headline.update({f"grammar_share_b{r[0]}": round(r[8], 4) for r in rows})
    headline["compile_first_ms"] = round(first_compile * 1000)
    return (f"{rounds} round(s) per batch size, alternating which mode runs first; each unconstrained run "
            f"generates exactly the token counts of the latest constrained run; figures are medians over "
            f"rounds, the ratio the median of each round's ratio. Engine ms/step is the step's time outside "
            f"llama_decode (schedule, build batch, sample with masks, grammar advance); the grammar's share "
            f"is the difference over the unconstrained step.\n\n"
            f"{table}\n\ngrammar compile (product-review schema, Gemma vocabulary): first "
            f"{first_compile * 1000:.0f} ms (includes the one-time vocabulary trie), cached "
            f"{cached_compile * 1000:.2f} ms"), headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench structured", description=__doc__)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    if args.quick:
        sizes, args.tokens, args.rounds = [1, 2], 16, 1
    record = RunRecord("structured", args, args.model, argv)
    publish(record, *run(sizes, args.tokens, args.rounds, args.threads, args.model, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
