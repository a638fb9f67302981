"""The baseline: a plain llama_decode + numpy argmax loop, no scheduler, no engine.

It prefills all prompts in one batch (each under its own seq id, as llama-batched-bench does),
then decodes all of them together one token per step. Used as the golden-output reference and
as the micro-benchmark's ceiling.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from bindings import TokenBatch, Context, ContextSettings, DecodeOutcome, Model


@dataclass
class RawLoopRun:
    tokens: list[list[int]]  # generated token ids per prompt
    decode_seconds: float  # wall time of the generation steps (after prefill)
    steps: int
    # margins[i][j]: gap between the best and second-best logit when token j of prompt i was chosen
    margins: list[list[float]] = field(default_factory=list)
    # runner_ups[i][j]: the second-best token there
    runner_ups: list[list[int]] = field(default_factory=list)


def run_raw_loop(
    model: Model,
    prompts: list[list[int]],
    n_generate: int,
    n_threads: int = 2,
    n_ctx: int = 4096,
    batch_rows: int = 512,
    record_margins: bool = False,
    context: Context | None = None,
) -> RawLoopRun:
    """With `context` given (see raw_loop_context), it is cleared and reused, so repeated runs
    are timed on warm memory, like an engine's long-lived context."""
    n = len(prompts)
    if sum(len(p) for p in prompts) > batch_rows:
        raise ValueError("the raw loop prefills every prompt in one batch: raise batch_rows")
    if context is not None:
        context.clear()
        return _run(context, prompts, n_generate, batch_rows, record_margins)
    with raw_loop_context(model, max(n, 1), n_threads, n_ctx, batch_rows) as ctx:
        return _run(ctx, prompts, n_generate, batch_rows, record_margins)


def raw_loop_context(model: Model, n_seq_max: int, n_threads: int = 2, n_ctx: int = 4096,
                     batch_rows: int = 512, flash_attn: bool = False) -> Context:
    return Context(model, ContextSettings(
        n_ctx=n_ctx, n_batch=batch_rows, n_ubatch=batch_rows, n_seq_max=n_seq_max,
        n_threads=n_threads, n_threads_batch=n_threads, flash_attn=1 if flash_attn else 0,
    ))


def _run(ctx: Context, prompts: list[list[int]], n_generate: int, batch_rows: int,
         record_margins: bool) -> RawLoopRun:
    n = len(prompts)
    margins: list[list[float]] = [[] for _ in range(n)]
    runner_ups: list[list[int]] = [[] for _ in range(n)]

    def choose(logits: np.ndarray) -> np.ndarray:
        if record_margins:
            top2 = np.argpartition(logits, -2, axis=1)[:, -2:]
            rows = np.arange(len(logits))
            a, b = logits[rows, top2[:, 0]], logits[rows, top2[:, 1]]
            second = np.where(a <= b, top2[:, 0], top2[:, 1])
            for i, (gap, tok) in enumerate(zip(np.abs(b - a).tolist(), second.tolist())):
                margins[i].append(gap)
                runner_ups[i].append(tok)
        return np.argmax(logits, axis=1)

    batch = TokenBatch(batch_rows)
    for i, prompt in enumerate(prompts):
        batch.add_run(np.asarray(prompt, dtype=np.int32), 0, i, logits_last=True)
    decode_or_raise(ctx, batch)
    next_tokens = choose(ctx.logits(n))
    generated = [next_tokens]
    positions = np.array([len(p) for p in prompts], dtype=np.int32)
    batch.clear()
    batch.seq_ids[:n, 0] = np.arange(n)
    batch.n_seq_id[:n] = 1
    batch.logits[:n] = 1
    start = time.perf_counter()
    for _ in range(n_generate - 1):
        batch.token[:n] = next_tokens
        batch.pos[:n] = positions
        batch.n_tokens = n
        decode_or_raise(ctx, batch)
        next_tokens = choose(ctx.logits(n))
        positions += 1
        generated.append(next_tokens)
    elapsed = time.perf_counter() - start
    tokens = np.stack(generated, axis=1).tolist()
    return RawLoopRun(tokens, elapsed, n_generate - 1, margins, runner_ups)


def decode_or_raise(ctx: Context, batch: TokenBatch) -> None:
    """llama_decode for a benchmark's own context, where anything but OK is a broken run."""
    outcome = ctx.decode(batch)
    if outcome is not DecodeOutcome.OK:
        raise RuntimeError(f"benchmark decode returned {outcome}")
