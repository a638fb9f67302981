"""How long a step will take, learned from the steps the engine just ran.

A step's seconds are modelled as fixed + per token fed + per output row (an output row also
pays the projection over the whole vocabulary and its sampling). The three coefficients are
fitted by recency-weighted least squares over the last steps, so the model follows the
machine's speed, the thread governor's choice and a busy neighbour within a few steps.

When the recent steps all have one shape (say, every step decodes 16 rows), the data cannot
tell the fixed cost from the per-row one; a gentle pull toward a prior *shape* (fixed cost
about one row's, a row's cost split evenly between its token and its output), scaled to the
measured times, keeps the fit sensible there and vanishes once the shapes vary.
"""
from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np

_WINDOW = 128  # steps remembered
_DECAY = 0.97  # weight of a step one step older
_PRIOR_SHAPE = np.array([1.0, 0.5, 0.5])  # fixed, per token, per output row (relative)
_PRIOR_PULL = 0.05  # ridge strength, relative to the data's own curvature


class StepCost(NamedTuple):
    fixed_s: float
    per_token_s: float
    per_output_s: float

    def seconds(self, tokens: int, outputs: int) -> float:
        return self.fixed_s + self.per_token_s * tokens + self.per_output_s * outputs


class StepCostModel:
    """Fed by the engine core after every completed step; read by the scheduling policy."""

    def __init__(self) -> None:
        self._steps: collections.deque[tuple[int, int, float]] = collections.deque(maxlen=_WINDOW)
        self._fit: StepCost | None = None

    def record(self, tokens: int, outputs: int, seconds: float) -> None:
        self._steps.append((tokens, outputs, seconds))
        self._fit = None  # refitted lazily: only steps that need a prediction pay for it

    @property
    def n_steps(self) -> int:
        return len(self._steps)

    def estimate(self) -> StepCost | None:
        """The current fit, or None before any step has been seen."""
        if self._fit is None and self._steps:
            self._fit = _fit(self._steps)
        return self._fit


def _fit(steps: collections.deque[tuple[int, int, float]]) -> StepCost:
    data = np.array(steps, dtype=np.float64)
    x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    y = data[:, 2]
    w = _DECAY ** np.arange(len(data) - 1, -1, -1, dtype=np.float64)
    # The prior shape, scaled to fit the measured times as well as one number can.
    shape_pred = x @ _PRIOR_SHAPE
    scale = float(np.sum(w * y * shape_pred) / max(np.sum(w * shape_pred ** 2), 1e-12))
    prior = scale * _PRIOR_SHAPE
    xtw = x.T * w
    gram = xtw @ x
    pull = _PRIOR_PULL * np.maximum(np.diag(gram), 1e-12)
    theta = np.linalg.solve(gram + np.diag(pull), xtw @ y + pull * prior)
    # Negative costs are noise, never physics: fall back to the prior's share of that term.
    theta = np.where(theta > 0, theta, 0.1 * np.maximum(prior, 1e-9))
    return StepCost(*(float(t) for t in theta))
