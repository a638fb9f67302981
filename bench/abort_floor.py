"""The part of a flood step that no scheduler can interrupt, measured on the flood's own shape.

llama.cpp checks its abort callback between graph nodes. The logits of every row come from a
single node, the output projection over the whole vocabulary (262,144 entries for Gemma 3),
and for this small model that node is a large share of a decode step. An interactive request
arriving while it runs waits for it to end, whatever the scheduler decides. The node's time is
measured as the difference between a decode step with logits on every row and the same step
with logits on one row, on a context holding as many sequences as the flood runs. Also timed:
the same rows as two decodes of half as many, the price of halving the tail by splitting steps.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from bench.raw_loop import decode_or_raise, raw_loop_context
from bindings import TokenBatch, Model

FILLER_TOKEN = 500  # any ordinary token: only the shape of the step matters here


@dataclass(frozen=True)
class UninterruptibleTail:
    step_ms: float  # a decode step of the flood's rows, logits on every row
    tail_ms: float  # of which the output projection, which cannot be aborted
    halves_ms: float | None = None  # the same rows as two decodes of half the rows each

    @property
    def split_cost(self) -> float | None:
        """What splitting such a step in two costs per token, as a fraction of the step."""
        return None if self.halves_ms is None or self.step_ms <= 0 else self.halves_ms / self.step_ms - 1.0

    @property
    def share(self) -> float:
        return self.tail_ms / self.step_ms if self.step_ms > 0 else 0.0

    def wait_ms(self, quantile: float = 0.95) -> float:
        """The given quantile of the wait for an arrival at a uniformly random moment of such
        steps, even with an abort that acts instantly everywhere else: only arrivals inside
        the tail wait, for what is left of it."""
        if self.share <= 0:
            return 0.0
        return self.tail_ms * max(0.0, 1.0 - (1.0 - quantile) / self.share)


class TailProbe:
    """A context filled like the flood (rows sequences of context_tokens cells each), timed on
    demand so each trial gets its own figure on a machine whose speed drifts."""

    def __init__(self, model: Model, rows: int, context_tokens: int, threads: int, flash_attn: bool) -> None:
        cells = rows * (context_tokens + 1)
        self.rows, self.position = rows, context_tokens
        self.context = raw_loop_context(model, max(rows, 1), threads, n_ctx=max(256, -(-cells // 256) * 256),
                                        batch_rows=256, flash_attn=flash_attn)
        self.batch = TokenBatch(256)
        filler = np.full(context_tokens, FILLER_TOKEN, dtype=np.int32)
        for seq in range(rows):
            self.batch.clear()
            self.batch.add_run(filler, 0, seq, logits_last=False)
            decode_or_raise(self.context, self.batch)

    def measure(self, repeats: int = 5) -> UninterruptibleTail:
        whole, half = [range(self.rows)], (self.rows + 1) // 2
        split = [range(half), range(half, self.rows)] if self.rows > 1 else None
        every_row, one_row, halves = [], [], []
        for _ in range(repeats):  # interleaved: every kind sees the same machine
            every_row.append(self._time_steps(whole, all_logits=True))
            one_row.append(self._time_steps(whole, all_logits=False))
            if split is not None:
                halves.append(self._time_steps(split, all_logits=True))
        step, without = statistics.median(every_row), statistics.median(one_row)
        return UninterruptibleTail(step_ms=step, tail_ms=max(0.0, step - without),
                                   halves_ms=statistics.median(halves) if halves else None)

    def close(self) -> None:
        self.context.close()

    def _time_steps(self, parts: list[range], all_logits: bool) -> float:
        """Milliseconds to decode one token for each sequence, one llama_decode per part."""
        elapsed = 0.0
        for part in parts:
            self.batch.clear()
            for seq in part:
                self.batch.add(FILLER_TOKEN, self.position, [seq], logits=all_logits or seq == part[0])
            start = time.perf_counter()
            decode_or_raise(self.context, self.batch)
            elapsed += (time.perf_counter() - start) * 1000.0
        for seq in range(self.rows):  # back to the same fill for the next timing
            self.context.seq_rm(seq, self.position, -1)
        return elapsed
