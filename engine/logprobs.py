"""Per-token log-probabilities of the model's own distribution, for requests that ask."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely tokens and their logprobs, best first


def snapshot_rows(logits: np.ndarray, rows: list[int]) -> dict[int, np.ndarray]:
    """Copies of the raw rows, taken before the sampler adjusts logits in place."""
    return {r: np.array(logits[r], dtype=np.float64) for r in rows}


def token_logprob(raw_row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    peak = raw_row.max()
    log_z = peak + np.log(np.exp(raw_row - peak).sum())
    top = np.argpartition(-raw_row, n_top - 1)[:n_top]
    top = top[np.argsort(-raw_row[top], kind="stable")]
    return TokenLogprob(
        token=token,
        logprob=float(raw_row[token] - log_z),
        top=tuple((int(t), float(raw_row[t] - log_z)) for t in top),
    )
