"""Batch invariance: does a request's output depend on who else is running? Greedy texts and
prompt logprobs, alone against together, flash attention off and on, in one run.

For each flash-attention setting, an engine with the prefix cache off (so a lone request's KV
cells start at cell 0) runs:

  greedy alone      each of --requests prompts by itself, temperature 0, --tokens tokens (ignore_eos)
  greedy together   all of them submitted at once, then again in reverse order: texts identical to
                    the lone ones, out of --requests
  arrivals          the same number of longer prompts (HISTORY_WORDS words of context each),
                    greedy, all submitted at once against one every STAGGER_S seconds (a server's
                    arrivals: each prompt's chunks share steps with others' decode rows, and every
                    cell of a request is computed in steps of other shapes in the two runs): texts
                    identical, the largest move before parting, and at each parting the first run's
                    top-2 gap
  decode together   the generated tokens' logprobs, together against alone, up to where the texts
                    part: the largest difference; and where they part, how much the lone run
                    preferred its token over the one chosen together (its top-2 gap there)
  scores alone      each prompt's prompt logprobs by itself (max_tokens 0)
  scores together   all at once: the largest absolute difference from the lone scores
  offset            each prompt scored alone again, but after a finished filler prompt (about 600
                    tokens) left its cells in the prefix cache (a second engine, cache on): the
                    prompt's cells start further in and the attended range is wider; largest
                    difference from the lone scores at cell 0
  chunking          each prompt scored alone with a step budget of 5 tokens, so its prompt is
                    prefilled 5 rows per step instead of in one piece: largest difference
  rows per step     one longer prompt scored alone, prefilled B rows per step for several B,
                    against the same prompt in one piece

The last two take the neighbours away and change one thing each (where the cells are, how many
rows a step holds), to show which of them moves a row's result.

  draft rows        16 sequences, each a few hundred cells deep, decoding together (llama_decode
                    directly): each one's next row in a plain step of 16 rows, against the same
                    rows with k draft rows behind each (the shape of a drafted step; 64 rows or
                    more take ggml's tiled flash-attention kernel): how far the logprobs of each
                    row's two likeliest tokens move, and its top-2 gap
  prompt chunk      the same 16 rows in a step that also prefills another sequence's prompt (64 or
                    256 tokens, no logits), with and without draft rows: the shape of a step at 16
                    clients while a new request's prompt comes in
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from bench.draft_price import fill_sequences
from bench.prompts import benchmark_prompts
from bench.record import RunRecord, add_common_arguments, publish_report
from bench.table import markdown_table
from bindings import Context, ContextSettings, DecodeOutcome, Model, TokenBatch
from engine import Engine, GenerationResult, Request
from engine.model_source import resolve_model
from engine.prompt_scores import log_normalizers

# Long enough that the cells a prompt is given start past the first 256, the granularity of the
# attended cell range.
FILLER = "Notes from the harbour office, kept for the night shift. " * 50
CHUNK_ROWS = 5  # a prompt prefilled this many rows per step


def greedy_request(prompt: str, tokens: int) -> Request:
    return Request(prompt=prompt, max_tokens=tokens, ignore_eos=True, logprobs=2)


def greedy(engine: Engine, prompts: list[str], tokens: int, together: bool) -> list[GenerationResult]:
    requests = [greedy_request(p, tokens) for p in prompts]
    if together:
        return [h.result() for h in engine.submit_many(requests)]
    return [engine.submit(r).result() for r in requests]


HISTORY_WORDS = 150  # about 200 tokens of context, like an agent loop's tool result
STAGGER_S = 0.15  # between arrivals: a step or two of 16 streams


def arrivals(settings: dict[str, Any], model: str | None, n: int, tokens: int) -> tuple[list, list]:
    """Greedy results of n longer prompts submitted at once, and submitted one every STAGGER_S."""
    prompts = benchmark_prompts(n, HISTORY_WORDS)
    with Engine(model, step_token_budget=256, prefix_cache=False, **{**settings, "n_ctx": 8192}) as engine:
        together = greedy(engine, prompts, tokens, together=True)
        handles = []
        for p in prompts:
            handles.append(engine.submit(greedy_request(p, tokens)))
            time.sleep(STAGGER_S)
        return together, [h.result() for h in handles]


def decode_drift(alone: list[GenerationResult], other: list[GenerationResult]) -> tuple[float, list[float]]:
    """The largest move of a generated token's logprob before the two runs part, and at each parting
    the lone run's logprob of its token minus that of the other's (a lower bound where the other's
    token is not among its top 2)."""
    drift, partings = 0.0, []
    for a, b in zip(alone, other):
        for x, y in zip(a.logprobs, b.logprobs):
            if x.token != y.token:
                top = dict(x.top)
                partings.append(round(x.logprob - top.get(y.token, min(top.values())), 4))
                break
            drift = max(drift, abs(x.logprob - y.logprob))
    return drift, partings


def scores(engine: Engine, prompts: list[str], together: bool, before: str | None = None) -> list[np.ndarray]:
    requests = [Request(prompt=p, max_tokens=0, prompt_logprobs=0) for p in prompts]
    if together:
        results = [h.result() for h in engine.submit_many(requests)]
    else:
        results = []
        for r in requests:
            if before is not None:  # leaves its blocks in the prefix cache: r's cells start after them
                engine.submit(Request(prompt=before, max_tokens=1)).result()
            results.append(engine.submit(r).result())
    return [np.array([e.logprob for e in r.prompt_logprobs[1:]]) for r in results]


SWEEP_PROMPT = ("Write a short paragraph about the history of the printing press and how it changed Europe in "
                "the fifteenth century, with dates and names:") * 2
SWEEP_ROWS = (1, 4, 5, 8, 32, 48, 64)


def rows_sweep(settings: dict[str, Any], model: str | None, quick: bool) -> dict[int, float]:
    """Largest difference of SWEEP_PROMPT's scores prefilled B rows per step from one piece."""
    def scored(rows: int) -> np.ndarray:
        with Engine(model, **{**settings, "max_running": 1}, step_token_budget=rows, prefix_cache=False) as engine:
            return scores(engine, [SWEEP_PROMPT], together=False)[0]

    whole = scored(256)
    return {rows: float(np.abs(scored(rows) - whole).max()) for rows in (SWEEP_ROWS[:3] if quick else SWEEP_ROWS)}


DRAFT_STREAMS = 16
DRAFT_ROWS = (2, 3, 4)  # per sequence: 48 rows, then 64 and 80 (the tiled kernel's)
DRAFT_CONTEXT_WORDS = 300
# (draft rows per sequence, tokens of another sequence's prompt in the step): a step of 16 clients
# with a new request's prompt chunk (the step budget's 256 at most), drafted or not
CHUNK_SHAPES = ((0, 64), (0, 256), (2, 256))
QUICK_CHUNK_SHAPES = ((0, 32),)


def _logprobs_of(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """[i, j]: row i's log-probability of tokens[i, j]."""
    return np.take_along_axis(rows, tokens, axis=1) - log_normalizers(rows)[:, None]


def step_shape_drift(flash: bool, threads: int, model_path: str | None,
                     quick: bool) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """The largest move of a row's top-2 tokens' logprobs, and of its top-2 gap, when each of the
    sequences' next rows shares its step with other rows: k draft rows behind each (keyed by the
    step's rows), or another sequence's prompt chunk with or without them (keyed "rows+chunk").
    A row sees only its own sequence's cells before it, so what the other rows hold does not
    matter to it, only the step's shape."""
    streams, ks = (4, DRAFT_ROWS[:1]) if quick else (DRAFT_STREAMS, DRAFT_ROWS)
    chunk_shapes = QUICK_CHUNK_SHAPES if quick else CHUNK_SHAPES
    longest_chunk = max(c for _, c in chunk_shapes)
    rng = np.random.default_rng(0)
    with Model(resolve_model(model_path)) as model:
        prompts = [model.tokenize(p)[:400] for p in benchmark_prompts(streams, DRAFT_CONTEXT_WORDS)]
        incoming = model.tokenize(FILLER)[:longest_chunk]  # the new request's prompt, cells from 0
        settings = ContextSettings(n_ctx=(streams + 1) * 512, n_batch=512, n_ubatch=512, n_seq_max=streams + 1,
                                   n_threads=threads, n_threads_batch=threads, flash_attn=int(flash))
        with Context(model, settings) as context:
            batch = TokenBatch(512, 1)
            fill_sequences(context, batch, [tokens[:-1] for tokens in prompts], chunk=512)

            def step(k: int, chunk: int = 0) -> np.ndarray:
                batch.clear()
                for seq, tokens in enumerate(prompts):
                    batch.add(tokens[-1], len(tokens) - 1, (seq,), True)
                    for i in range(k):
                        batch.add(int(rng.integers(1_000, 20_000)), len(tokens) + i, (seq,), True)
                if chunk:
                    batch.add_run(np.asarray(incoming[:chunk], dtype=np.int32), 0, streams, False)
                if context.decode(batch) is not DecodeOutcome.OK:
                    raise RuntimeError("llama_decode failed on a measured step")
                rows = context.logits(streams * (1 + k)).reshape(streams, 1 + k, -1)[:, 0].copy()
                for seq, tokens in enumerate(prompts):
                    context.seq_rm(seq, len(tokens) - 1, -1)
                context.seq_rm(streams, 0, -1)
                return rows

            plain = step(0)
            top2 = np.argsort(-plain, axis=-1)[:, :2]
            before = _logprobs_of(plain, top2)

            def moved(rows: np.ndarray) -> dict[str, float]:
                after = _logprobs_of(rows, top2)
                gap_move = np.abs((before[:, 0] - before[:, 1]) - (after[:, 0] - after[:, 1]))
                return {"top2_logprob": float(np.abs(after - before).max()), "top2_gap": float(gap_move.max())}

            drafted = {str(streams * (1 + k)): moved(step(k)) for k in ks}
            chunked = {f"{streams * (1 + k)}+{chunk}": moved(step(k, chunk)) for k, chunk in chunk_shapes}
    return drafted, chunked


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def measure(flash: bool, prompts: list[str], tokens: int, threads: int, model: str | None,
            quick: bool = False) -> dict[str, Any]:
    settings = dict(n_ctx=4096, max_running=max(16, len(prompts)), n_threads=threads, flash_attn=flash,
                    adaptive_threads=False)
    start = time.perf_counter()
    with Engine(model, step_token_budget=256, prefix_cache=False, **settings) as engine:
        alone = greedy(engine, prompts, tokens, together=False)
        together = greedy(engine, prompts, tokens, together=True)
        reverse = greedy(engine, prompts[::-1], tokens, together=True)[::-1]
        drift, partings = decode_drift(alone, together)
        drift_reversed, partings_reversed = decode_drift(alone, reverse)
        lone_scores = scores(engine, prompts, together=False)
        joint_scores = scores(engine, prompts, together=True)
    with Engine(model, step_token_budget=256, prefix_cache=True, **settings) as engine:
        offset_scores = scores(engine, prompts, together=False, before=FILLER)
    arrived_together, arrived_staggered = arrivals(settings, model, len(prompts), tokens)
    history_drift, history_partings = decode_drift(arrived_together, arrived_staggered)
    drafted, chunked_steps = step_shape_drift(flash, threads, model, quick)
    chunked = {**settings, "max_running": CHUNK_ROWS}
    with Engine(model, step_token_budget=CHUNK_ROWS, prefix_cache=False, **chunked) as engine:
        chunked_scores = scores(engine, prompts, together=False)
    return {
        "flash_attn": flash,
        "requests": len(prompts),
        "greedy_same_together": sum(a.token_ids == b.token_ids for a, b in zip(alone, together)),
        "greedy_same_reversed": sum(a.token_ids == b.token_ids for a, b in zip(alone, reverse)),
        "greedy_first_differing": next((i for i, (a, b) in enumerate(zip(alone, together))
                                        if a.token_ids != b.token_ids), None),
        "decode_together_max_diff": max(drift, drift_reversed),
        "decode_partings_gap_nats": sorted(partings + partings_reversed),
        "arrivals_same": sum(a.token_ids == b.token_ids for a, b in zip(arrived_together, arrived_staggered)),
        "arrivals_max_diff": history_drift,
        "arrivals_partings_gap_nats": sorted(history_partings),
        "scores_together_max_diff": max_diff(lone_scores, joint_scores),
        "scores_offset_max_diff": max_diff(lone_scores, offset_scores),
        "scores_chunked_max_diff": max_diff(lone_scores, chunked_scores),
        "prompt_tokens": [len(s) + 1 for s in lone_scores],
        "rows_per_step_max_diff": rows_sweep(settings, model, quick),
        "draft_rows_drift": drafted,
        "prompt_chunk_drift": chunked_steps,
        "seconds": round(time.perf_counter() - start, 1),
    }


def _spread(values: list[float]) -> str:
    return f"{min(values):.3g} to {max(values):.3g} ({len(values)})" if values else "-"


def report(rows: list[dict[str, Any]], tokens: int) -> tuple[str, dict[str, Any]]:
    table = markdown_table(
        ["flash attention", "greedy texts identical together", "... in reverse order",
         "generated tokens' logprobs together, before parting: max abs diff", "top-2 gap alone where they part",
         "prompt logprobs together: max abs diff", "alone, cells further in", f"alone, {CHUNK_ROWS}-row chunks"],
        [["on" if r["flash_attn"] else "off", f"{r['greedy_same_together']}/{r['requests']}",
          f"{r['greedy_same_reversed']}/{r['requests']}", f"{r['decode_together_max_diff']:.3g}",
          _spread(r["decode_partings_gap_nats"]), f"{r['scores_together_max_diff']:.3g}",
          f"{r['scores_offset_max_diff']:.3g}", f"{r['scores_chunked_max_diff']:.3g}"] for r in rows])
    summary = (f"{rows[0]['requests']} prompts, greedy, {tokens} tokens each; prompt logprobs of the same prompts "
               f"({min(rows[0]['prompt_tokens'])}-{max(rows[0]['prompt_tokens'])} tokens). Differences are "
               f"against each prompt run alone on an idle engine with its cells from 0.\n\n{table}")
    sweep_rows = list(rows[0]["rows_per_step_max_diff"])
    sweep = markdown_table(["flash attention", *[f"{b} rows" for b in sweep_rows]],
                           [["on" if r["flash_attn"] else "off",
                             *[f"{r['rows_per_step_max_diff'][b]:.3g}" for b in sweep_rows]] for r in rows])
    summary += ("\n\nOne prompt alone, prefilled B rows per step: largest difference of its prompt logprobs "
                f"from the same prompt prefilled in one piece.\n\n{sweep}")
    draft_rows = list(rows[0]["draft_rows_drift"])
    drafts = markdown_table(["flash attention", *[f"{n} rows: top-2 logprobs / top-2 gap" for n in draft_rows]],
                            [["on" if r["flash_attn"] else "off",
                              *[f"{r['draft_rows_drift'][n]['top2_logprob']:.3g} / {r['draft_rows_drift'][n]['top2_gap']:.3g}"
                                for n in draft_rows]] for r in rows])
    n_streams = int(draft_rows[0]) // (1 + DRAFT_ROWS[0])
    summary += (f"\n\n{n_streams} sequences decoding together, each after {DRAFT_CONTEXT_WORDS} words of its own "
                f"context: their next rows in a plain step of {n_streams} rows against the same rows with draft rows "
                "behind each (the step's rows in the header); largest move of a row's two likeliest tokens' "
                f"logprobs, and of its top-2 gap.\n\n{drafts}")
    arrivals_table = markdown_table(
        ["flash attention", "greedy texts identical", "generated tokens' logprobs before parting: max abs diff",
         "top-2 gap where they part (together's)"],
        [["on" if r["flash_attn"] else "off", f"{r['arrivals_same']}/{r['requests']}", f"{r['arrivals_max_diff']:.3g}",
          _spread(r["arrivals_partings_gap_nats"])] for r in rows])
    summary += (f"\n\n{rows[0]['requests']} prompts after {HISTORY_WORDS} words of context each, greedy, {tokens} tokens, "
                f"all submitted at once against one every {STAGGER_S} s (arrivals, as a server sees them: every cell of "
                f"a request is computed in steps of other shapes in the two runs).\n\n{arrivals_table}")
    shapes = list(rows[0]["prompt_chunk_drift"])
    chunks = markdown_table(["flash attention", *[f"{n} rows: top-2 logprobs / top-2 gap" for n in shapes]],
                            [["on" if r["flash_attn"] else "off",
                              *[f"{r['prompt_chunk_drift'][n]['top2_logprob']:.3g} / {r['prompt_chunk_drift'][n]['top2_gap']:.3g}"
                                for n in shapes]] for r in rows])
    summary += ("\n\nThe same rows in a step that also prefills another sequence's prompt (rows + its prompt "
                "tokens in the header; draft rows behind each where the rows are more than the sequences): the "
                f"shape of a step at {n_streams} clients while a new request comes in.\n\n{chunks}")
    headline: dict[str, Any] = {}
    near_ties = []
    for r in rows:
        fa = "fa_on" if r["flash_attn"] else "fa_off"
        headline[f"greedy_same_{fa}"] = f"{r['greedy_same_together']}/{r['requests']}"
        headline[f"scores_diff_{fa}"] = r["scores_together_max_diff"]
        headline[f"decode_diff_{fa}"] = r["decode_together_max_diff"]
        headline[f"widest_parting_{fa}"] = max(r["decode_partings_gap_nats"], default=None)
        headline[f"arrivals_same_{fa}"] = f"{r['arrivals_same']}/{r['requests']}"
        headline[f"arrivals_diff_{fa}"] = r["arrivals_max_diff"]
        headline[f"widest_arrivals_parting_{fa}"] = max(map(abs, r["arrivals_partings_gap_nats"]), default=None)
        # Two tokens' logprobs moving apart: what a top-2 gap may move by with the shape alone.
        headline[f"near_tie_nats_{fa}"] = round(2 * max(
            r["decode_together_max_diff"], r["arrivals_max_diff"], r["scores_together_max_diff"], r["scores_chunked_max_diff"],
            *r["rows_per_step_max_diff"].values(),
            *(d["top2_logprob"] for d in r["draft_rows_drift"].values()),
            *(d["top2_logprob"] for d in r["prompt_chunk_drift"].values())), 3)
        headline[f"draft_rows_gap_move_{fa}"] = round(max(d["top2_gap"] for d in r["draft_rows_drift"].values()), 3)
        headline[f"prompt_chunk_gap_move_{fa}"] = round(max(d["top2_gap"] for d in r["prompt_chunk_drift"].values()), 3)
        near_ties.append(f"{headline[f'near_tie_nats_{fa}']} nats with flash attention "
                         f"{'on' if r['flash_attn'] else 'off'}")
    summary += ("\n\nA top-2 gap moves by up to twice the largest logprob move above when the batch's shape "
                f"alone changes (two tokens' logprobs moving apart): {', '.join(near_ties)}. Under that, a parting "
                "of two greedy runs is a near-tie the shape can flip.")
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench invariance", description=__doc__)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.tokens = 4, 8
    record = RunRecord("invariance", args, args.model, argv)
    prompts = benchmark_prompts(args.requests)
    rows = []
    for flash in (False, True):
        row = measure(flash, prompts, args.tokens, args.threads, args.model, args.quick)
        record.trial(**row)
        rows.append(row)
        print(f"flash attention {'on' if flash else 'off'}: {row}", file=sys.stderr)
    publish_report(record, lambda: report(rows, args.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
