"""Prompt logprobs (evaluation): every prompt row's logits scored against the next prompt token.

A request with prompt_logprobs has all its prompt rows flagged for output, not only the row that
samples, so a step's output block mixes sampling rows and scored rows in batch row order.
`map_outputs` flags the scored rows and says where each output lands; `record` turns the scored
rows into TokenLogprobs on their sequence. The row at position p predicts token p + 1, so the
last prompt row is a sampling row (or, with max_tokens 0, no output at all) and the first
prompt token has no score.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from engine.outputs import TokenLogprob
from engine.sequence import Sequence
from engine.step_plan import Chunk
from engine.tuning import SCORED_OUTPUT_BYTES, SCORED_ROWS_AT_ONCE



def max_scored_rows(n_vocab: int) -> int:
    """Scored prompt rows a step may carry: llama.cpp keeps its output buffer as large as the
    most output rows a step ever had, a vocabulary-wide row each."""
    return max(1, SCORED_OUTPUT_BYTES // (4 * n_vocab))


def scored_positions(chunk: Chunk) -> range:
    """The chunk's positions whose rows score the next prompt token."""
    seq = chunk.seq
    if seq.prompt_scores is None:
        return range(0)
    return range(chunk.start, min(chunk.start + chunk.length, seq.n_prompt - 1))


@dataclass(frozen=True)
class ScoredSpan:
    seq: Sequence
    first_position: int  # its first row's position: it scores token first_position + 1
    first_output: int  # index of that row in the step's output block
    count: int


@dataclass(frozen=True)
class OutputLayout:
    sampling: np.ndarray  # output index of each sampling row, in the order the runner returns them
    spans: tuple[ScoredSpan, ...]


def map_outputs(flags: np.ndarray, n_tokens: int, placed: Iterable[tuple[Chunk, int]]) -> OutputLayout | None:
    """Flag the scored rows of each chunk (given with its first batch row, in the runner's order)
    and map every output; None when the step scores nothing (its outputs are then exactly the
    sampling rows)."""
    placed = list(placed)
    spans = []
    for chunk, row in placed:
        positions = scored_positions(chunk)
        if positions:
            lo = row + positions.start - chunk.start
            flags[lo : lo + len(positions)] = 1
            spans.append((chunk.seq, positions.start, lo, len(positions)))
    if not spans:
        return None
    output_of = np.cumsum(flags[:n_tokens] != 0) - 1  # batch row -> its index among the outputs
    sampling = np.array([output_of[row + chunk.n_rows - 1 - len(chunk.draft) + j] for chunk, row in placed
                         if chunk.wants_logits for j in chunk.logit_rows], dtype=np.intp)
    return OutputLayout(sampling, tuple(ScoredSpan(seq, p, int(output_of[lo]), n) for seq, p, lo, n in spans))


def record(logits: np.ndarray, layout: OutputLayout) -> None:
    """Score each span's rows (log-softmax in float64) into its sequence's prompt_scores."""
    for span in layout.spans:
        seq, n_top = span.seq, span.seq.request.prompt_logprobs or 0
        for done in range(0, span.count, SCORED_ROWS_AT_ONCE):
            n = min(SCORED_ROWS_AT_ONCE, span.count - done)
            out = span.first_output + done
            first = span.first_position + done + 1  # the first token these rows score
            rows = np.asarray(logits[out : out + n], dtype=np.float64)
            seq.prompt_scores[first : first + n] = score_rows(rows, seq.tokens[first : first + n], n_top)


def log_normalizers(rows: np.ndarray) -> np.ndarray:
    """Each row's log of its softmax's denominator: a logit minus it is that token's logprob."""
    peak = rows.max(axis=1, keepdims=True)
    return peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))


def score_rows(rows: np.ndarray, targets: list[int], n_top: int) -> list[TokenLogprob]:
    """Each row's log-probability of its target token under the row's softmax, and its n_top best."""
    log_z = log_normalizers(rows)
    picked = rows[np.arange(len(targets)), targets] - log_z
    scores = []
    for i, token in enumerate(targets):
        top: tuple[tuple[int, float], ...] = ()
        if n_top:
            best = np.argpartition(-rows[i], n_top - 1)[:n_top]
            best = best[np.argsort(-rows[i][best], kind="stable")]
            top = tuple((int(t), float(rows[i][t] - log_z[i])) for t in best)
        scores.append(TokenLogprob(token=int(token), logprob=float(picked[i]), top=top))
    return scores


def finished_scoring(chunks: Iterable[Chunk]) -> list[Sequence]:
    """Sequences of this step that only score (max_tokens 0) and whose prompt is now computed."""
    return [c.seq for c in chunks
            if c.seq.request.max_tokens == 0 and c.seq.n_computed >= c.seq.n_prompt]
