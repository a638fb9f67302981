"""Picks the next token for every output row of a step, exactly and without full sorts.

(Over 300 lines on purpose: the exact top-k, nucleus and two-level draws share one set of work
buffers and grid constants; split apart they would pass those around on every call.)

Per row: logit_bias and penalties (sparse, in place) -> grammar mask -> temperature -> top-k ->
top-p -> min-p -> draw from the row's own generator.

* Top-k, exact, in about one pass over the row: take every `stride`-th logit (a strided view,
  ~16k entries), and let tau be the k-th largest of that subset. At least k logits of the row
  are >= tau, so the k largest all are: one comparison pass yields a few thousand candidates
  containing the exact top-k, which a small partition and sort finish.
* Top-k under a large grammar mask: the k largest allowed logits from the 2k columns with the
  largest maxima, exact when k of them beat every column left out; the row is masked only
  when they do not.
* Top-p without top-k: the nucleus is the head of the sorted row, so exact top-k for growing k
  (256, 2048, ...) until the head holds top_p of the total mass (one exp pass for the total).
* Min-p is a threshold, logit >= max + T*ln(min_p); alone (top_k=0, top_p=1) it is one
  comparison pass and never exponentiates the whole row.
* Plain temperature sampling (no truncation) draws in two levels: the row's weights in ~1k
  strided groups, a group by its mass, then a token inside it; one exp pass, no full cumsum.
* Greedy rows without grammar or edits: one argmax over the whole block when all rows are.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sampling.params import SamplingParams
from sampling.penalties import apply_logit_edits

if TYPE_CHECKING:  # the sampler only calls allowed_mask / is_allowed
    from sampling.grammar.matcher import GrammarMatcher

# Top-p without top-k: the nucleus candidates start at this many tokens and grow 8x.
_NUCLEUS_START = 256
# Column-maxima grid: at most this many columns, at least 16 rows.
_MAX_COLUMNS = 4096
# Plain sampling by rejection: proposals per batch and batches before the exact fallback.
_PROPOSALS = 32
_REJECTION_ROUNDS = 4
# Plain sampling: number of strided groups of the two-level draw.
_GROUPS = 1024
# A grammar mask allowing at most this many tokens is used as a list of ids (a gather of the
# allowed logits) instead of a -inf bias vector added to the whole row.
_SMALL_ALLOWED = 8192
_NEG_INF_BITS = np.int32(-8388608)  # 0xFF800000, the bit pattern of float32 -inf


class NoAllowedTokenError(RuntimeError):
    """The grammar allowed no token for some rows; those requests must fail.

    Raised after every other row was sampled: `tokens` holds the step's tokens (-1 for the
    failed rows), so the engine can fail `rows` and carry on with the rest.
    """

    def __init__(self, rows: list[int], tokens: np.ndarray) -> None:
        super().__init__(f"the grammar allows no token for batch row(s) {rows}")
        self.rows = rows
        self.tokens = tokens


@dataclass
class RowContext:
    """Everything the sampler needs about one output row."""

    params: SamplingParams
    rng: np.random.Generator
    generated: Sequence[int] = ()  # tokens generated so far; penalties count these (not the prompt)
    matcher: GrammarMatcher | None = None  # grammar constraint; the sampler never advances it
    remaining_tokens: int | None = None  # passed to the matcher for complete-within-budget masks


class _MaskEntry:
    __slots__ = ("mask", "count", "ids", "_bias")

    def __init__(self, mask: np.ndarray) -> None:
        self.mask = mask  # held so id(mask) cannot be reused while cached
        self.count = int(np.count_nonzero(mask))
        self.ids: np.ndarray | None = np.flatnonzero(mask) if 0 < self.count <= _SMALL_ALLOWED else None
        self._bias: np.ndarray | None = None

    @property
    def bias(self) -> np.ndarray:
        """0.0 where allowed, -inf elsewhere; built on first use (top-k rarely needs it)."""
        if self._bias is None:
            bits = self.mask.astype(np.int32)
            bits -= 1  # 0 where allowed, -1 (all ones) where not
            bits &= _NEG_INF_BITS  # -> 0.0 / -inf
            self._bias = bits.view(np.float32)
            self._bias.flags.writeable = False
        return self._bias


class BatchSampler:
    def __init__(
        self, vocab_size: int, *, mask_cache_size: int = 32, grammar_fast_paths: bool = True
    ) -> None:
        """grammar_fast_paths=False always masks the whole row (tests compare the two)."""
        self.vocab_size = vocab_size
        self.grammar_fast_paths = grammar_fast_paths
        self._cols = max(1, min(_MAX_COLUMNS, vocab_size // 16))
        self._rows = vocab_size // self._cols
        self._main = self._rows * self._cols
        self._row_starts = np.arange(self._rows, dtype=np.int64) * self._cols
        self._tail = np.arange(self._main, vocab_size, dtype=np.int64)
        self._group_len = -(-vocab_size // _GROUPS)
        # Work buffers reused every step (never a per-step (n, V) allocation). The exp buffer
        # is padded to whole groups; the padding stays 0 (a weight of 0) forever.
        self._weights = np.zeros(self._group_len * _GROUPS, dtype=np.float32)
        self._masked = np.empty(vocab_size, dtype=np.float32)
        self._flags = np.empty(vocab_size, dtype=bool)
        self._masks: OrderedDict[int, _MaskEntry] = OrderedDict()
        self._mask_cache_size = mask_cache_size

    # ------------------------------------------------------------------ public API
    def sample_rows(self, logits: np.ndarray, rows: list[RowContext]) -> np.ndarray:
        """One int64 token per row.

        logits: (len(rows), vocab) float32, typically a view into llama.cpp's output buffer.
        Rows whose params have logit_bias or penalties are edited IN PLACE (the buffer is
        discarded after sampling); other rows are only read. A read-only row is copied first.
        Each row draws only from its own generator, so a row's token does not depend on the
        other rows of the batch. If a grammar allows no token for some rows, the other rows
        are still sampled and NoAllowedTokenError (with the tokens) is raised at the end.
        """
        n = len(rows)
        if logits.ndim != 2 or logits.shape[0] != n or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits shape {logits.shape} does not match {n} rows x {self.vocab_size}")
        if all(c.matcher is None and c.params.is_greedy and not c.params.edits_logits for c in rows):
            return np.argmax(logits, axis=1).astype(np.int64, copy=False)
        out = np.empty(n, dtype=np.int64)
        failed: list[int] = []
        for i, ctx in enumerate(rows):
            token = self._sample_row(logits[i], ctx)
            if token is None:
                failed.append(i)
                token = -1
            out[i] = token
        if failed:
            raise NoAllowedTokenError(failed, out)
        return out

    def top_k(self, row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact k largest values of one row, descending, with their token ids."""
        return self._top_k(row, k)

    # ------------------------------------------------------------------ one row
    def _sample_row(self, row: np.ndarray, ctx: RowContext) -> int | None:
        p = ctx.params
        if p.edits_logits:
            if not row.flags.writeable:
                row = row.copy()
            apply_logit_edits(row, p, ctx.generated)
        matcher = ctx.matcher
        rem = ctx.remaining_tokens
        if p.is_greedy:
            token = int(np.argmax(row))
            # argmax returns the first maximum; if it is allowed it is also the first maximum
            # among the allowed tokens, i.e. exactly the masked argmax.
            if matcher is None or matcher.is_allowed(token, rem):
                return token
            entry = self._mask_entry(matcher.allowed_mask(rem))
            if entry is None:
                return None
            if entry.ids is not None:
                return int(entry.ids[np.argmax(row[entry.ids])])
            np.add(row, entry.bias, out=self._masked)
            token = int(np.argmax(self._masked))
            return token if entry.mask[token] else int(np.argmax(entry.mask))  # all allowed are -inf
        if matcher is None:
            return self._draw(row, p, ctx.rng)
        if not p.truncates and self.grammar_fast_paths:
            # Fast path, exact only without top-k/top-p/min-p. Draw t from the unmasked law p;
            # keep it if allowed, else draw again (fresh randomness) from the masked law.
            # With A the allowed set and q = p(not A), for t in A:
            #   P(out = t) = p(t) + q * p(t) / (1 - q) = p(t) / (1 - q),
            # which is exactly the masked, renormalised law. (With truncation the kept set
            # would depend on the disallowed tokens, so the identity fails; we mask first.)
            token = self._draw_full(row, p.temperature, ctx.rng)
            if matcher.is_allowed(token, rem):
                return token
        entry = self._mask_entry(matcher.allowed_mask(rem))
        if entry is None:
            return None
        if entry.ids is not None:
            values = row[entry.ids]
            if not np.isfinite(values.max()):
                return int(entry.ids[np.argmax(values)])
            return self._draw_candidates(values, entry.ids, p, ctx.rng)
        if p.top_k > 0 and self.grammar_fast_paths:
            top = self._top_k_allowed(row, p.top_k, entry.mask)
            if top is not None:
                return _draw_sorted(*top, p, ctx.rng)
        np.add(row, entry.bias, out=self._masked)
        if not np.isfinite(self._masked.max()):
            return int(np.argmax(entry.mask))
        return self._draw(self._masked, p, ctx.rng)

    def _mask_entry(self, mask: np.ndarray) -> _MaskEntry | None:
        """Cached per mask object (matchers return cached masks); None if nothing is allowed."""
        if mask.shape != (self.vocab_size,):
            raise ValueError(f"grammar mask has shape {mask.shape}, the vocabulary {self.vocab_size} tokens")
        key = id(mask)
        entry = self._masks.get(key)
        if entry is not None and entry.mask is mask:
            self._masks.move_to_end(key)
        else:
            entry = _MaskEntry(mask)
            self._masks[key] = entry
            while len(self._masks) > self._mask_cache_size:
                self._masks.popitem(last=False)
        return entry if entry.count else None

    # ------------------------------------------------------------------ unconstrained draws
    def _draw(self, row: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
        """Temperature / top-k / top-p / min-p draw from a row (-inf entries never drawn)."""
        T = p.temperature
        colmax = self._column_maxima(row)
        if p.top_k > 0:
            values, ids = self._top_k(row, p.top_k, colmax)
            return _draw_sorted(values, ids, p, rng)
        if not p.truncates:
            return self._draw_full(row, T, rng, colmax)
        top = self._row_max(row, colmax)
        if p.top_p >= 1.0:  # min-p alone: a threshold, only columns reaching it are read
            ids = self._at_least(row, _f32_at_least(top + T * math.log(p.min_p)), colmax)
            return _draw_unsorted(row[ids], ids, top, T, rng)
        ids = self._nucleus(row, top, T, p.top_p)
        values = row[ids]
        if p.min_p > 0.0:  # the nucleus and the min-p set are both heads of the sorted row
            keep = values >= _f32_at_least(top + T * math.log(p.min_p))
            ids, values = ids[keep], values[keep]
        return _draw_unsorted(values, ids, top, T, rng)

    def _nucleus(self, row: np.ndarray, top: float, T: float, top_p: float) -> np.ndarray:
        """Ids of the exact top-p nucleus of softmax(row / T): the fewest most likely tokens
        whose probability reaches top_p. A selection by mass, not a sort: split the candidates
        at a pivot weight (estimated from a strided sample); if the heavier side alone reaches
        the remaining mass the nucleus lies in it, else all of it is in and the search goes on
        in the lighter side. Only the last <= 2048 candidates are sorted."""
        _, masses = self._group_masses(row, top, T)
        w = self._weights[: self.vocab_size]
        need = top_p * float(masses.sum(dtype=np.float64))
        # A first cut, one pass: a pivot weight from a strided sample, a bit below where the
        # sample's mass reaches top_p, lowered until the tokens above it hold enough mass.
        sample = np.sort(w[:: max(1, self.vocab_size // 4096)])[::-1]
        frac = np.cumsum(sample, dtype=np.float64) / float(sample.sum(dtype=np.float64))
        at = int(np.searchsorted(frac, top_p))
        while True:
            at += max(8, at // 8)
            if at >= sample.size:
                ids = np.arange(self.vocab_size)
                break
            np.greater_equal(w, sample[at], out=self._flags)
            ids = np.flatnonzero(self._flags)
            if float(w[ids].sum(dtype=np.float64)) >= need:
                break
            at *= 2
        cw = w[ids]
        inside: list[np.ndarray] = []
        acc = 0.0
        while cw.size > 2048:
            cand_mass = float(cw.sum(dtype=np.float64))
            sample = np.sort(cw[:: cw.size // 1024])[::-1]
            frac = np.cumsum(sample, dtype=np.float64) / max(float(sample.sum(dtype=np.float64)), 1e-300)
            at = int(np.searchsorted(frac, (need - acc) / cand_mass)) + 8  # a little past the estimate
            pivot = sample[min(at, sample.size - 1)]
            hi = cw >= pivot
            hi_mass = float(cw[hi].sum(dtype=np.float64))
            n_hi = int(np.count_nonzero(hi))
            if n_hi in (0, cw.size):
                break  # no progress (ties or a degenerate sample): sort what is left
            if acc + hi_mass >= need:
                ids, cw = ids[hi], cw[hi]
            else:
                acc += hi_mass
                inside.append(ids[hi])
                ids, cw = ids[~hi], cw[~hi]
        order = np.argsort(-cw, kind="stable")
        cum = acc + np.cumsum(cw[order], dtype=np.float64)
        keep = min(int(np.searchsorted(cum, need, side="left")) + 1, cw.size)
        inside.append(ids[order[:keep]])
        return np.concatenate(inside) if len(inside) > 1 else inside[0]

    # The row's first R*C logits seen as an (R, C) grid: column c holds tokens c, c + C, ...;
    # the last V - R*C tokens (the tail, < C of them) are always treated as candidates.
    def _column_maxima(self, row: np.ndarray) -> np.ndarray:
        return row[: self._main].reshape(self._rows, self._cols).max(axis=0)

    def _row_max(self, row: np.ndarray, colmax: np.ndarray) -> float:
        top = float(colmax.max())
        return max(top, float(row[self._main :].max())) if self._main < self.vocab_size else top

    def _columns_ids(self, cols: np.ndarray) -> np.ndarray:
        ids = (self._row_starts[:, None] + cols[None, :]).ravel()
        return np.concatenate([ids, self._tail]) if self._tail.size else ids

    def _at_least(self, row: np.ndarray, threshold: np.float32, colmax: np.ndarray) -> np.ndarray:
        """Ids of all logits >= threshold: only columns whose maximum reaches it can hold one."""
        cand = self._columns_ids(np.flatnonzero(colmax >= threshold))
        return cand[row[cand] >= threshold]

    def _top_k(self, row: np.ndarray, k: int, colmax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact k largest logits (fewer if the row has fewer finite ones), descending.

        The k largest lie in the k columns with the largest maxima (any logit x outside them
        is <= its column's maximum <= each chosen column's maximum, so k logits are >= x)."""
        V = row.shape[0]
        k = max(1, min(k, V))
        if k < self._cols:
            if colmax is None:
                colmax = self._column_maxima(row)
            cols = np.argpartition(colmax, self._cols - k)[self._cols - k :]
            cand = self._columns_ids(cols)
            values = row[cand]
        else:
            cand, values = np.arange(V), row
        values, cand = _largest_sorted(values, cand, k)
        finite = values > -np.inf
        if not finite.all():
            cand, values = cand[finite], values[finite]
        if not values.size:
            raise ValueError("the logits row has no finite value")
        return values, cand

    def _top_k_allowed(self, row: np.ndarray, k: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Exact k largest allowed logits, descending, read from the 2k columns with the largest
        maxima: a token outside them is <= sigma, the largest maximum left out, so if k allowed
        candidates exceed sigma they are the answer. None if too few do (mask the whole row)."""
        m = 2 * k
        if m >= self._cols:
            return None
        colmax = self._column_maxima(row)
        part = np.argpartition(colmax, self._cols - m - 1)
        sigma = colmax[part[self._cols - m - 1]]
        cand = self._columns_ids(part[self._cols - m :])
        values = row[cand]
        keep = mask[cand] & (values > sigma)
        if np.count_nonzero(keep) < k:
            return None
        return _largest_sorted(values[keep], cand[keep], k)

    def _group_masses(self, row: np.ndarray, top: float, T: float) -> tuple[np.ndarray, np.ndarray]:
        """Weights exp((row - top) / T) as a (group_len, G) grid, column g holding tokens g,
        g + G, g + 2G, ... (padding weighs 0), and each group's total weight."""
        w = self._weights[: self.vocab_size]
        np.subtract(row, np.float32(top), out=w)
        np.multiply(w, np.float32(1.0 / T), out=w)
        np.exp(w, out=w)
        grid = self._weights.reshape(self._group_len, _GROUPS)
        return grid, grid.sum(axis=0)

    def _draw_full(
        self, row: np.ndarray, T: float, rng: np.random.Generator, colmax: np.ndarray | None = None
    ) -> int:
        """Exact draw from softmax(row / T) over the whole row.

        First by rejection with a column envelope: every logit of column c is <= its maximum
        M_c, so propose column c with probability proportional to R * exp((M_c - top) / T), a
        uniform token x in it, and accept with probability exp((x - M_c) / T) <= 1 (tail
        tokens are proposed with their exact weight and always accepted). An accepted proposal
        has exactly the softmax law. After _REJECTION_ROUNDS batches of failures, fall back to
        an exact two-level draw (one exp pass: a group by its mass, then a token in it); the
        mixture of "accepted" and "fallback" is still exactly the softmax law, since both are
        exact draws and the fallback's randomness is independent of the rejected proposals.
        """
        if colmax is None:
            colmax = self._column_maxima(row)
        top = self._row_max(row, colmax)
        R, C = self._rows, self._cols
        env = np.exp((colmax.astype(np.float64) - top) / T) * R
        if self._tail.size:
            env = np.concatenate([env, np.exp((row[self._main :].astype(np.float64) - top) / T)])
        env_cum = np.cumsum(env)
        for _ in range(_REJECTION_ROUNDS):
            picks = np.searchsorted(env_cum, rng.random(_PROPOSALS) * env_cum[-1], side="right")
            picks = np.minimum(picks, env.size - 1)
            r = rng.integers(0, R, size=_PROPOSALS)
            u = rng.random(_PROPOSALS)
            in_grid = picks < C
            cols = np.where(in_grid, picks, 0)
            tokens = np.where(in_grid, r * C + cols, self._main + (picks - C))
            x = row[tokens].astype(np.float64)
            accept = np.where(in_grid, u < np.exp((x - colmax[cols].astype(np.float64)) / T), env[picks] > 0)
            hit = np.flatnonzero(accept)
            if hit.size:
                return int(tokens[hit[0]])
        grid, masses = self._group_masses(row, top, T)
        group_cum = np.cumsum(masses, dtype=np.float64)
        x = rng.random() * group_cum[-1]
        g = _first_above(group_cum, x)
        if g:
            x -= group_cum[g - 1]
        j = _first_above(np.cumsum(grid[:, g], dtype=np.float64), x)
        return g + j * _GROUPS

    def _draw_candidates(self, values: np.ndarray, ids: np.ndarray, p: SamplingParams, rng) -> int:
        """Draw among an explicit candidate set that is the whole support (small masks)."""
        if not p.truncates:
            return _draw_unsorted(values, ids, float(values.max()), p.temperature, rng)
        return _draw_sorted(*_largest_sorted(values, ids, p.top_k), p, rng)


# ---------------------------------------------------------------------- helpers
def _f32_at_least(threshold: float) -> np.float32:
    """The smallest float32 >= threshold: for float32 x, x >= it  <=>  x >= threshold."""
    t = np.float32(threshold)
    return t if float(t) >= threshold else np.nextafter(t, np.float32(np.inf))


def _largest_sorted(values: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values (all of them if k <= 0 or there are no more), descending, with their
    ids; ties keep the order the partition left them in."""
    if 0 < k < values.size:
        part = np.argpartition(values, values.size - k)[values.size - k :]
        values, ids = values[part], ids[part]
    order = np.argsort(-values, kind="stable")
    return values[order], ids[order]


def _first_above(cum: np.ndarray, x: float) -> int:
    """First index j with cum[j] > x (so its weight is positive); clamps float round-off."""
    j = int(np.searchsorted(cum, x, side="right"))
    if j >= cum.size:  # x reached the total by rounding: take the last positive weight
        j = cum.size - 1
        while j > 0 and cum[j] == cum[j - 1]:
            j -= 1
    return j


def _draw_unsorted(values: np.ndarray, ids: np.ndarray, top: float, T: float, rng) -> int:
    cum = np.cumsum(np.exp((values.astype(np.float64) - top) / T))
    return int(ids[_first_above(cum, rng.random() * cum[-1])])


def _draw_sorted(values: np.ndarray, ids: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """Temperature, top-p and min-p over candidates sorted by descending logit, then draw."""
    T = p.temperature
    v = values.astype(np.float64)
    top = v[0]
    cum = np.cumsum(np.exp((v - top) / T))
    keep = cum.size
    if p.top_p < 1.0:  # smallest prefix whose probability reaches top_p (at least one token)
        keep = min(keep, int(np.searchsorted(cum, p.top_p * cum[-1], side="left")) + 1)
    if p.min_p > 0.0:  # p >= min_p * p_max  <=>  logit >= max + T ln(min_p); v is descending
        keep = min(keep, int(np.searchsorted(-v, -(top + T * math.log(p.min_p)), side="right")))
    cum = cum[:keep]
    return int(ids[_first_above(cum, rng.random() * cum[-1])])
