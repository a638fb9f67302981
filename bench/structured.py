"""Structured output against free text: constrained (JSON Schema, jump-forward on and off) and
unconstrained generation on the same prompts and sampling settings, in one run, at B = 1 and 8;
grammar compile time (first and cached) and the mask time per token.

The unconstrained baseline generates, for every prompt, exactly as many tokens as the latest
constrained run did (ignoring end-of-generation): a JSON document ends when it is complete, so
constrained requests finish at different steps, and a baseline that always ran --tokens tokens
would keep every row to the end and batch better. B requests are in flight at a time, the next
submitted as soon as one finishes. Throughput is tokens over wall time from the first
submission to the last result, for every mode. With jump-forward, tokens the grammar forces are
appended unsampled and fed in one chunk (engine/jump_forward.py); the table gives their share of
the output and the tokens each step produced. Ratios are taken within each round, modes in an
order that rotates between rounds (the machine's speed drifts), then their median.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from bench.prompts import benchmark_prompts
from bench.schemas import NAMED
from bench.mask_timing import cobatch_mask_times, llguidance_mask_times
from bench.stats import percentile
from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from engine import Engine
from engine.request import Request
from sampling.grammar import compile_grammar
from sampling.params import SamplingParams

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9}


def measure(engine: Engine, prompts: list[str], lengths: list[int], schema: dict | None, batch: int) -> dict:
    """One round: with a schema, each prompt up to its length; without, exactly its length;
    `batch` requests in flight, the next submitted as soon as one finishes (closed loop)."""
    requests = [Request(prompt=p, max_tokens=n, sampling=SamplingParams(seed=3, **SAMPLING),
                        **({"format": "json", "json_schema": schema} if schema else {"ignore_eos": True}))
                for p, n in zip(prompts, lengths)]
    results: list = [None] * len(requests)
    errors: list[BaseException] = []
    order = iter(range(len(requests)))
    lock = threading.Lock()

    def client() -> None:
        while not errors:
            with lock:
                i = next(order, None)
            if i is None:
                return
            try:
                results[i] = engine.submit(requests[i]).result()
            except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
                errors.append(exc)

    steps_before = engine.stats().steps
    start = time.perf_counter()
    clients = [threading.Thread(target=client) for _ in range(batch)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    if errors:
        raise errors[0]
    wall = time.perf_counter() - start
    steps = engine.stats().steps - steps_before
    tokens = sum(r.metrics.tokens_generated for r in results)
    return {
        "tok_s": tokens / wall,
        "tokens": tokens,
        "forced": sum(r.metrics.forced_tokens for r in results),
        "steps": steps,
        "tokens_per_step": tokens / max(steps, 1),
        "lengths": [r.metrics.tokens_generated for r in results],
        "wall_s": wall,
        "documents": [list(r.token_ids) for r in results] if schema else [],
    }


def mask_time_rows(engine: Engine, schema: dict, documents: list[list[int]], max_tokens: int,
                   record: RunRecord | None) -> list[list[object]]:
    def row(name: str, times: list[float], note: str) -> list[object]:
        us = [t * 1e6 for t in times]
        return [name, len(us), percentile(us, 50), percentile(us, 99), note]

    vocab = engine.vocabulary
    cold = cobatch_mask_times(schema, vocab, documents, max_tokens, fresh=True)
    warm = cobatch_mask_times(schema, vocab, documents, max_tokens)
    rows = [row("cobatch, fresh grammar", cold, "per-state caches empty at the start"),
            row("cobatch, warm grammar", warm, "the shared grammar after the runs above")]
    reference = llguidance_mask_times(schema, vocab, documents)
    if reference is None:
        rows.append(["llguidance", 0, "-", "-", "not installed (pip install 'cobatch[bench]')"])
    else:
        rows.append(row("llguidance fill_next_token_bitmask", reference["times"],
                        f"compile {reference['compile_s'] * 1000:.1f} ms; {reference['refused']} replay(s) refused"))
    if record is not None:
        record.trial(mask_us={"cobatch_fresh": [t * 1e6 for t in cold], "cobatch_warm": [t * 1e6 for t in warm],
                              "llguidance": None if reference is None else [t * 1e6 for t in reference["times"]]})
    return rows


MODES = ("jump", "sampled", "free")  # constrained with jump-forward, constrained without, unconstrained


def run(batch_sizes: list[int], max_tokens: int, rounds: int, threads: int, model: str | None,
        record: RunRecord | None = None, schema_name: str = "review", n_documents: int = 8) -> tuple[str, dict]:
    schema, asked_for = NAMED[schema_name]
    settings = dict(n_ctx=8192, max_running=max(batch_sizes), n_threads=threads, step_token_budget=512)
    with Engine(model, **settings) as engine, Engine(model, jump_forward=False, **settings) as plain:
        start = time.perf_counter()
        compile_grammar(schema, engine.vocabulary)
        first_compile = time.perf_counter() - start
        start = time.perf_counter()
        compile_grammar(schema, engine.vocabulary)
        cached_compile = time.perf_counter() - start
        rows, headline = [], {}
        documents: list[list[int]] = []
        for b in batch_sizes:
            # The same documents at every batch size (at least n_documents): one prompt's document
            # would make B = 1 a figure about that document.
            # At least 4 B documents, so that the last ones, finishing with fewer in flight, are a
            # small part of the round.
            prompts = [f"{p} Answer as {asked_for}." for p in benchmark_prompts(max(4 * b, n_documents))]
            budget = [max_tokens] * len(prompts)
            lengths = measure(engine, prompts, budget, schema, b)["lengths"]  # warm-up: fills the caches
            measure(plain, prompts, budget, schema, b)
            runs: dict[str, list[dict]] = {m: [] for m in MODES}
            jump_ratio, sampled_ratio = [], []
            for i in range(rounds):
                # rotate the order of the modes, so a drift in speed during a round cancels out
                for mode in MODES[i % 3:] + MODES[: i % 3]:
                    if mode == "jump":
                        runs[mode].append(measure(engine, prompts, budget, schema, b))
                        lengths = runs[mode][-1]["lengths"]
                    elif mode == "sampled":
                        runs[mode].append(measure(plain, prompts, budget, schema, b))
                    else:
                        runs[mode].append(measure(engine, prompts, [max(n, 1) for n in lengths], None, b))
                free = runs["free"][-1]["tok_s"]
                jump_ratio.append(runs["jump"][-1]["tok_s"] / free)
                sampled_ratio.append(runs["sampled"][-1]["tok_s"] / free)
                if record is not None:
                    record.trial(batch=b, **{m: {k: v for k, v in runs[m][-1].items() if k != "documents"}
                                             for m in MODES},
                                 ratio_jump=jump_ratio[-1], ratio_sampled=sampled_ratio[-1])
            med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in ("tok_s", "tokens_per_step")}
                   for m in MODES}
            share = sum(r["forced"] for r in runs["jump"]) / max(1, sum(r["tokens"] for r in runs["jump"]))
            rows.append([b, med["free"]["tok_s"], med["sampled"]["tok_s"], med["jump"]["tok_s"],
                         statistics.median(sampled_ratio), statistics.median(jump_ratio),
                         med["sampled"]["tokens_per_step"], med["jump"]["tokens_per_step"], share])
            headline[f"ratio_b{b}"] = round(statistics.median(jump_ratio), 3)
            headline[f"ratio_no_jump_b{b}"] = round(statistics.median(sampled_ratio), 3)
            headline[f"forced_share_b{b}"] = round(share, 3)
            documents += [d for r in runs["jump"] for d in r["documents"]]
        masks = mask_time_rows(engine, schema, documents, max_tokens, record)
    table = markdown_table(
        ["B", "unconstrained tok/s (same lengths)", "JSON tok/s, every token sampled", "JSON tok/s, jump-forward",
         "ratio, sampled / free", "ratio, jump-forward / free", "tokens per step, sampled",
         "tokens per step, jump-forward", "forced share of JSON tokens"], rows)
    mask_table = markdown_table(["mask computation", "steps timed", "p50 µs", "p99 µs", "notes"], masks)
    table = f"{table}\n\nMask time per token, replaying the constrained outputs above:\n\n{mask_table}"
    headline["compile_first_ms"] = round(first_compile * 1000)
    headline["schema"] = schema_name
    return (f"{rounds} round(s) per batch size, each over the same max({n_documents}, 4 B) documents, B in "
            f"flight (the next submitted as one finishes); "
            f"the three modes run in an order rotating between rounds; "
            f"each unconstrained run generates exactly the token counts of the latest jump-forward run; "
            f"tok/s is tokens over wall time from submission to the last result; figures are medians "
            f"over rounds, each ratio the median of the rounds' ratios. Tokens per step include the "
            f"prefill steps.\n\n"
            f"{table}\n\ngrammar compile ({schema_name} schema, Gemma vocabulary): first "
            f"{first_compile * 1000:.0f} ms (includes the one-time vocabulary trie), cached "
            f"{cached_compile * 1000:.2f} ms"), headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench structured", description=__doc__)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--documents", type=int, default=8,
                        help="documents per round at each batch size (at least 4 B), B in flight")
    parser.add_argument("--schema", choices=sorted(NAMED), default="review",
                        help="review: string-heavy (the product spec's); order: fixed keys, enums, numbers")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    if args.quick:
        sizes, args.tokens, args.rounds, args.documents = [1, 2], 16, 1, 2
    record = RunRecord("structured", args, args.model, argv)
    publish(record, *run(sizes, args.tokens, args.rounds, args.threads, args.model, record, args.schema, args.documents))
    return 0


if __name__ == "__main__":
    sys.exit(main())
