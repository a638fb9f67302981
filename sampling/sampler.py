"""Picks the next token for every output row of a step at once, exactly and without full sorts.

Top-k uses block maxima: the k largest logits of a row lie in the k blocks with the largest
maxima, so one pass computing block maxima plus a small partition over k blocks' worth of
candidates gives the exact top-k without touching the rest of the 262k-entry row again.
"""
from __future__ import annotations

import numpy as np

from sampling.params import SamplingParams

_BLOCK = 256
# When neither top-k nor top-p narrows the distribution, candidates start at this many tokens
# and double until they provably contain the whole nucleus.
_NUCLEUS_START = 256


class BatchSampler:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._n_blocks = -(-vocab_size // _BLOCK)
        self._offsets = np.arange(_BLOCK, dtype=np.int64)

    def sample(
        self,
        logits: np.ndarray,
        params: list[SamplingParams],
        rngs: list[np.random.Generator],
    ) -> np.ndarray:
        """logits: (n_rows, vocab) float32, may be a view into llama.cpp memory (never written)."""
        n = logits.shape[0]
        out = np.empty(n, dtype=np.int64)
        greedy = [i for i, p in enumerate(params) if p.is_greedy]
        if len(greedy) == n:
            return np.argmax(logits, axis=1)
        for i in greedy:
            out[i] = int(np.argmax(logits[i]))
        with_k = [i for i, p in enumerate(params) if not p.is_greedy and p.top_k > 0]
        if with_k:
            k_max = max(params[i].top_k for i in with_k)
            values, ids = self._top_k(logits, with_k, k_max)
            for row, i in enumerate(with_k):
                p = params[i]
                out[i] = _draw(values[row, : p.top_k], ids[row, : p.top_k], p, rngs[i])
        for i, p in enumerate(params):
            if not p.is_greedy and p.top_k == 0:
                out[i] = self._sample_unbounded(logits[i], p, rngs[i])
        return out

    def top_k(self, row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact k largest values of one row, descending, with their token ids."""
        values, ids = self._top_k(row[None, :], [0], k)
        return values[0], ids[0]

    def _top_k(self, logits: np.ndarray, rows: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.vocab_size)
        sub = logits if len(rows) == logits.shape[0] else logits[rows]
        maxima = self._block_maxima(sub)
        n_blocks = min(k, self._n_blocks)
        best_blocks = np.argpartition(-maxima, n_blocks - 1, axis=1)[:, :n_blocks]
        cand = (best_blocks[:, :, None] * _BLOCK + self._offsets).reshape(len(rows), -1)
        valid = cand < self.vocab_size
        cand = np.minimum(cand, self.vocab_size - 1)
        cand_values = np.take_along_axis(sub, cand, axis=1)
        cand_values = np.where(valid, cand_values, -np.inf)
        part = np.argpartition(-cand_values, k - 1, axis=1)[:, :k]
        top_values = np.take_along_axis(cand_values, part, axis=1)
        order = np.argsort(-top_values, axis=1, kind="stable")
        values = np.take_along_axis(top_values, order, axis=1)
        ids = np.take_along_axis(np.take_along_axis(cand, part, axis=1), order, axis=1)
        return values, ids

    def _block_maxima(self, sub: np.ndarray) -> np.ndarray:
        full = self.vocab_size // _BLOCK
        maxima = sub[:, : full * _BLOCK].reshape(sub.shape[0], full, _BLOCK).max(axis=2)
        if full < self._n_blocks:
            maxima = np.concatenate([maxima, sub[:, full * _BLOCK :].max(axis=1, keepdims=True)], axis=1)
        return maxima

    def _sample_unbounded(self, row: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
        scaled = row.astype(np.float64) / p.temperature
        weights = np.exp(scaled - scaled.max())
        total = weights.sum()
        if p.top_p >= 1.0:
            return int(np.searchsorted(np.cumsum(weights), rng.random() * total, side="right"))
        k = _NUCLEUS_START
        while True:
            values, ids = self.top_k(row, k)
            mass = np.exp(values.astype(np.float64) / p.temperature - scaled.max()).sum() / total
            if mass >= p.top_p or k >= self.vocab_size:
                return _draw(values, ids, p, rng, total_weight=total)
            k *= 4


def _draw(
    values: np.ndarray,
    ids: np.ndarray,
    p: SamplingParams,
    rng: np.random.Generator,
    total_weight: float | None = None,
) -> int:
    """Sample among candidates sorted by descending logit, after temperature and top-p.

    total_weight is the whole distribution's mass (on the scale where the top candidate weighs
    1) when the candidates are only the head of it; top-p is then measured against that mass.
    """
    scaled = values.astype(np.float64) / p.temperature
    weights = np.exp(scaled - scaled[0])
    cumulative = np.cumsum(weights)
    if p.top_p < 1.0:
        # Smallest prefix whose probability reaches top_p (at least one token).
        mass = cumulative[-1] if total_weight is None else total_weight
        keep = int(np.searchsorted(cumulative, p.top_p * mass, side="left")) + 1
        cumulative = cumulative[:keep]
    choice = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(ids[min(choice, len(cumulative) - 1)])
