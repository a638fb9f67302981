"""What idle cached cells cost a prefill: the exchange rate behind `idle_cells_per_prompt_token`.

Idle cached prefixes keep their cells in the unified KV cache, and llama.cpp's attention walks
every used cell for every prompt row: with flash attention it checks and skips their mask
entries, without it it attends over them. The engine drops idle cached cells before a long
prefill when the tokens to prefill would pay more for them than the cache's measured hit share
is worth (engine/prefix_reuse.py). The rate it weighs them with depends on the model's shape
and the attention kernel, so it is measured here, for any GGUF:

- one context, `--idle` cells filled under one seq id (what the prefix cache's holders keep);
- a distinct `--prompt`-token prefill under another seq id, in chunks of the engine's step
  budget, timed with those cells present and after removing them, in alternating rounds;
- idle cells per prompt token = idle x t_without / (t_with - t_without): how many idle cells
  cost one prompt row as much as computing one more prompt token does.

Run it with flash attention on (the server's default) and off (the Python Engine's default),
and pass the figure for the setting you serve with as `--idle-cells-per-prompt-token`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from bindings import Context, ContextSettings, DecodeOutcome, Model, TokenBatch
from engine.config import EngineConfig
from engine.model_source import resolve_model

_IDLE_SEQ, _PROMPT_SEQ = 1, 2


def _prefill(context: Context, batch: TokenBatch, tokens: np.ndarray, seq_id: int, chunk: int) -> float:
    """Seconds to compute `tokens` under seq_id from position 0, `chunk` tokens per decode."""
    started = time.perf_counter()
    for start in range(0, len(tokens), chunk):
        batch.clear()
        part = tokens[start:start + chunk]
        batch.add_run(part, start, seq_id, start + len(part) == len(tokens))
        if context.decode(batch) is not DecodeOutcome.OK:
            raise RuntimeError("llama_decode failed; lower --idle or --prompt")
    return time.perf_counter() - started


def _tokens(n: int, seed: int, n_vocab: int) -> np.ndarray:
    # Ordinary text tokens, distinct per seed, so no prefix is shared between the two sequences.
    return np.random.default_rng(seed).integers(1_000, min(n_vocab, 200_000), size=n, dtype=np.int32)


def measure(model: Model, flash_attn: bool, idle: int, prompt: int, rounds: int, threads: int,
            chunk: int, record: RunRecord | None) -> dict[str, float]:
    n_ctx = -(-(idle + prompt + 256) // 256) * 256
    context = Context(model, ContextSettings(n_ctx=n_ctx, n_batch=chunk, n_ubatch=chunk, n_seq_max=4,
                                             n_threads=threads, n_threads_batch=threads, swa_full=True,
                                             flash_attn=1 if flash_attn else 0))
    batch = TokenBatch(chunk)
    with_idle, without = [], []
    try:
        _prefill(context, batch, _tokens(prompt, 0, model.n_vocab), _PROMPT_SEQ, chunk)  # warm-up
        context.seq_rm(_PROMPT_SEQ)
        for r in range(rounds):
            distinct = _tokens(prompt, 100 + r, model.n_vocab)
            order = ("without", "with") if r % 2 else ("with", "without")
            for case in order:
                if case == "with":
                    _prefill(context, batch, _tokens(idle, 200 + r, model.n_vocab), _IDLE_SEQ, chunk)
                seconds = _prefill(context, batch, distinct, _PROMPT_SEQ, chunk)
                context.seq_rm(_PROMPT_SEQ)
                context.seq_rm(_IDLE_SEQ)
                (with_idle if case == "with" else without).append(seconds)
                if record is not None:
                    record.trial(flash_attn=flash_attn, round=r, idle_cells=idle if case == "with" else 0,
                                 prompt_tokens=prompt, seconds=seconds)
    finally:
        context.close()
    t_with, t_without = statistics.median(with_idle), statistics.median(without)
    rate = idle * t_without / (t_with - t_without) if t_with > t_without else float("inf")
    return {"with_tok_s": prompt / t_with, "without_tok_s": prompt / t_without, "cells_per_token": rate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench idle-cells", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=10_240, help="idle cached cells present during the prefill")
    parser.add_argument("--prompt", type=int, default=3_072, help="tokens of the timed prefill")
    parser.add_argument("--flash-attn", default="on,off", help="flash attention settings to measure: on, off or both")
    add_common_arguments(parser, trials=4)
    args = parser.parse_args(argv)
    if args.quick:
        args.idle, args.prompt, args.trials = 512, 256, 2
    record = RunRecord("idle-cells", args, args.model, argv)
    chunk = EngineConfig.step_token_budget
    rows, headline = [], {}
    with Model(resolve_model(args.model)) as model:
        for setting in args.flash_attn.split(","):
            fa = setting.strip() == "on"
            figures = measure(model, fa, args.idle, args.prompt, args.trials, args.threads, chunk, record)
            rows.append([setting, args.idle, args.prompt, figures["without_tok_s"], figures["with_tok_s"],
                         figures["with_tok_s"] / figures["without_tok_s"], figures["cells_per_token"]])
            rate = figures["cells_per_token"]
            # No slowdown measured (a run too small to see one): no rate to report.
            headline[f"cells_per_token_fa_{setting}"] = round(rate) if rate != float("inf") else None
    table = markdown_table(["flash attention", "idle cells", "prompt tokens", "tok/s without", "tok/s with",
                            "with / without", "idle cells per prompt token"], rows)
    publish(record, table + f"\n\n{args.trials} alternating rounds; medians. The last column is the rate to "
            "pass as --idle-cells-per-prompt-token for that attention setting.", headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
