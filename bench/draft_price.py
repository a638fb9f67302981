"""What a draft row costs against what it must save: the acceptance drafts need to pay, by streams.

A drafted token is one more batch row with logits; a step with drafts pays only if the model
keeps enough of them. This measures it with `llama_decode` directly, no engine:

- one context; `s` sequences, each `--depth` cells deep (distinct text tokens);
- plain steps (one row with logits per sequence) and steps where every sequence also carries k
  draft rows with logits, for each k of `--draft-rows`; the drafted cells are removed after each
  step, so every step sees the same depth; the cases interleave, their order reversed each round;
- break-even acceptance with k rows = (t_k / t_0 - 1) / k: the tokens each draft row must add on
  average for a drafted step to make tokens as fast as a plain one. At 1 or more, no drafts can.

`--forced-rows` times steps where each sequence feeds k more rows without logits before its
sampling row: the tokens jump-forward appends to a structured answer. They are fed whether a
draft is kept or not, so a draft's break-even is the same with them: the price says what share of
a structured step they take, and what a token of it is worth to a draft (a sampling row's).

`--step-rows` times steps that carry k draft rows in all, on the first sequences (up to four
each), as a drafted step of many streams does: llama.cpp's kernels for repacked weights project
four output rows at a time and each row left over alone, so what k rows add depends on where the
step's output rows land against a multiple of four, not on k alone.

`--kv unified,split` repeats it with llama.cpp's per-sequence caches, where a row attends to its
own sequence's cells only. The engine keeps one unified pool (its block ledger and prefix sharing
need it); the split case says what attention over the other sequences' cells costs a step.
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
from engine.model_source import resolve_model

_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
_CHUNK = 512


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _context(model: Model, streams: int, depth: int, max_k: int, unified: bool, threads: int,
             flash_attn: int) -> Context:
    per_seq = -(-(depth + max_k + 1) // 256) * 256
    return Context(model, ContextSettings(n_ctx=streams * per_seq, n_batch=_CHUNK, n_ubatch=_CHUNK,
                                          n_seq_max=streams, n_threads=threads, n_threads_batch=threads,
                                          flash_attn=flash_attn, kv_unified=unified))


def fill_sequences(context: Context, batch: TokenBatch, token_lists: list[np.ndarray], chunk: int = _CHUNK) -> None:
    """Sequence i's cells hold token_lists[i], fed `chunk` tokens a call, no logits."""
    for seq, tokens in enumerate(token_lists):
        for start in range(0, len(tokens), chunk):
            batch.clear()
            batch.add_run(np.asarray(tokens[start:start + chunk], dtype=np.int32), start, seq, False)
            if context.decode(batch) is not DecodeOutcome.OK:
                raise RuntimeError("llama_decode failed while filling the sequences")


def _random_tokens(streams: int, depth: int, n_vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(streams)
    return [rng.integers(1_000, min(n_vocab, 200_000), size=depth, dtype=np.int32) for _ in range(streams)]


_STEP_ROWS_PER_SEQ = 4


def _rows_per_seq(kind: str, streams: int, k: int) -> list[int]:
    """Rows each sequence feeds after its next one: k each, or (kind "step") k in all, up to
    _STEP_ROWS_PER_SEQ on each of the first sequences."""
    if kind != "step":
        return [k] * streams
    return [min(_STEP_ROWS_PER_SEQ, max(0, k - seq * _STEP_ROWS_PER_SEQ)) for seq in range(streams)]


def _step(context: Context, batch: TokenBatch, streams: int, depth: int, k: int, rng: np.random.Generator,
          kind: str = "draft") -> float:
    """Seconds of one step: each sequence's next row and k draft rows after it, logits on all; or
    (`forced`) k rows without logits and its sampling row after them; or (`step`) k draft rows in
    the whole step."""
    batch.clear()
    for seq, extra in enumerate(_rows_per_seq(kind, streams, k)):
        for i in range(1 + extra):
            batch.add(int(rng.integers(1_000, 20_000)), depth + i, (seq,), kind != "forced" or i == extra)
    started = time.perf_counter()
    if context.decode(batch) is not DecodeOutcome.OK:
        raise RuntimeError("llama_decode failed on a timed step")
    seconds = time.perf_counter() - started
    for seq in range(streams):
        context.seq_rm(seq, depth, -1)
    return seconds


def measure(model: Model, streams: int, depth: int, ks: list[int], unified: bool, rounds: int, steps: int,
            threads: int, flash_attn: int, record: RunRecord | None,
            forced_ks: tuple[int, ...] = (), step_ks: tuple[int, ...] = ()) -> dict[tuple[str, int], float]:
    """Median seconds of a step with k draft rows per sequence, for k = 0 and each of ks, with
    k forced rows for each of forced_ks, and with k draft rows in all for each of step_ks; keyed
    ("draft", k), ("forced", k) and ("step", k)."""
    cases = [("draft", 0), *(("draft", k) for k in ks), *(("forced", k) for k in forced_ks),
             *(("step", k) for k in step_ks if k <= streams * _STEP_ROWS_PER_SEQ)]
    deepest = max(max(_rows_per_seq(kind, streams, k)) for kind, k in cases)
    context = _context(model, streams, depth, deepest, unified, threads, flash_attn)
    batch = TokenBatch(_CHUNK, 1)
    rng = np.random.default_rng(0)
    times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    try:
        fill_sequences(context, batch, _random_tokens(streams, depth, model.n_vocab))
        for kind, k in cases:  # warm-up: each shape once
            _step(context, batch, streams, depth, k, rng, kind)
        for r in range(rounds):
            for kind, k in (cases if r % 2 == 0 else cases[::-1]):
                for _ in range(steps):
                    seconds = _step(context, batch, streams, depth, k, rng, kind)
                    times[kind, k].append(seconds)
                    if record is not None:
                        rows = {"draft": {"draft_rows": k}, "forced": {"draft_rows": 0, "forced_rows": k},
                                "step": {"draft_rows": 0, "step_draft_rows": k}}[kind]
                        record.trial(kv="unified" if unified else "split", streams=streams, depth=depth,
                                     **rows, round=r, seconds=seconds)
    finally:
        context.close()
    return {k: statistics.median(v) for k, v in times.items()}


def _per_row_ms(t_plain: float, t_more: float, streams: int, k: int) -> float:
    return (t_more - t_plain) * 1000 / (streams * k)


def break_even(t_plain: float, t_drafted: float, k: int) -> float:
    """Tokens each of k draft rows per sequence must add for the drafted step to keep up."""
    return (t_drafted / t_plain - 1.0) / k


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench draft-price", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,4,16", help="sequences decoding together, comma-separated")
    parser.add_argument("--depth", type=int, default=384, help="cells each sequence holds before the timed steps")
    parser.add_argument("--draft-rows", default="1,2,4", help="draft rows per sequence, comma-separated")
    parser.add_argument("--forced-rows", default="", help="forced rows (no logits) per sequence, comma-separated")
    parser.add_argument("--step-rows", default="",
                        help="draft rows in the whole step (on the first sequences, up to 4 each), comma-separated")
    parser.add_argument("--kv", default="unified", help="KV cache layouts to measure: unified, split or both")
    parser.add_argument("--flash-attn", choices=sorted(_FLASH_ATTN), default="auto",
                        help="the attention kernel (auto: what cobatch serve uses)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per case and round")
    add_common_arguments(parser, trials=6)
    args = parser.parse_args(argv)
    if args.quick:
        (args.streams, args.depth, args.draft_rows, args.forced_rows, args.step_rows, args.trials,
         args.steps) = "1,2", 64, "2", "1", "1", 2, 2
    streams_list, ks, forced_ks = _ints(args.streams), _ints(args.draft_rows), _ints(args.forced_rows)
    step_ks = _ints(args.step_rows)
    layouts = [x.strip() for x in args.kv.split(",") if x.strip()]
    if not streams_list or not ks or min(streams_list + ks + forced_ks + step_ks) < 1 or args.depth < 1:
        parser.error("--streams, --draft-rows, --forced-rows, --step-rows and --depth take positive integers")
    if any(layout not in ("unified", "split") for layout in layouts) or not layouts:
        parser.error("--kv takes unified, split or both (comma-separated)")
    record = RunRecord("draft-price", args, args.model, argv)
    rows, forced_table, step_table, headline, plain_ms = [], [], [], {}, {}
    with Model(resolve_model(args.model)) as model:
        for layout in layouts:
            for streams in streams_list:
                t = measure(model, streams, args.depth, ks, layout == "unified", args.trials, args.steps,
                            args.threads, _FLASH_ATTN[args.flash_attn], record, tuple(forced_ks), tuple(step_ks))
                plain = t["draft", 0]
                plain_ms[layout, streams] = plain * 1000
                for k in ks:
                    rate = break_even(plain, t["draft", k], k)
                    rows.append([layout, streams, plain * 1000, plain * 1000 / streams, k, t["draft", k] * 1000,
                                 _per_row_ms(plain, t["draft", k], streams, k), rate])
                    if layout == "unified":
                        headline[f"break_even_s{streams}_k{k}"] = round(rate, 3)
                draft_row_ms = _per_row_ms(plain, t["draft", ks[0]], streams, ks[0])
                for k in forced_ks:
                    row_ms = _per_row_ms(plain, t["forced", k], streams, k)
                    forced_table.append([layout, streams, plain * 1000, k, t["forced", k] * 1000, row_ms,
                                         row_ms / draft_row_ms])
                    if layout == "unified":
                        headline[f"forced_row_ms_s{streams}_k{k}"] = round(row_ms, 2)
                        headline[f"forced_over_draft_row_s{streams}_k{k}"] = round(row_ms / draft_row_ms, 3)
                for k in step_ks:
                    if ("step", k) not in t:
                        continue
                    added_ms = (t["step", k] - plain) * 1000
                    # Tokens the k rows must add for the step to keep up: its added time in plain tokens.
                    needed = added_ms / (plain * 1000 / streams)
                    step_table.append([layout, streams, plain * 1000, k, streams + k, t["step", k] * 1000, added_ms,
                                       needed / k])
                    if layout == "unified":
                        headline[f"step_rows_added_ms_s{streams}_k{k}"] = round(added_ms, 2)
    table = markdown_table(["KV cache", "streams", "plain step ms", "ms per token (plain)", "draft rows per seq",
                            "drafted step ms", "ms per draft row", "break-even acceptance"], rows)
    if forced_table:
        table += "\n\n" + markdown_table(
            ["KV cache", "streams", "plain step ms", "forced rows per seq", "step ms", "ms per forced row",
             f"over a draft row ({ks[0]} per seq)"], forced_table)
    if step_table:
        table += "\n\n" + markdown_table(
            ["KV cache", "streams", "plain step ms", "draft rows in the step", "output rows", "step ms",
             "ms added", "break-even acceptance"], step_table)
    notes = [f"{args.trials} rounds of {args.steps} steps per case, cases interleaved and reversed each round; "
             f"medians. Each sequence {args.depth} cells deep; flash attention {args.flash_attn}; "
             f"{args.threads} threads. Break-even acceptance: the tokens each draft row must add on average "
             "for a drafted step to make tokens as fast as a plain step (1 or more: no drafts can pay)."]
    if "unified" in layouts and "split" in layouts:
        for streams in streams_list:
            ratio = plain_ms["unified", streams] / plain_ms["split", streams]
            headline[f"unified_over_split_s{streams}"] = round(ratio, 3)
        notes.append("Plain step, unified cache over per-sequence caches: " + ", ".join(
            f"{headline[f'unified_over_split_s{s}']:.2f}x at {s} stream(s)" for s in streams_list) + ".")
    publish(record, table + "\n\n" + "\n\n".join(notes), headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
