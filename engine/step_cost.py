"""How long a step will take, learned from the steps the engine just ran.

A step's seconds are modelled as fixed + per token fed + per output row (an output row also
pays the projection over the whole vocabulary and its sampling) + a step on its own for a step
with more than one output row: llama.cpp's CPU projection of one row is a matrix-vector product,
of two or more a matrix product that costs far more than one row more (with Gemma 3 270M's
262k vocabulary, most of a one-stream step: docs/speculative-decoding.md). That jump is what a
draft at one stream pays first. The four coefficients are
fitted by recency-weighted least squares over the last steps run with the thread count asked
about, so the model follows the machine's speed and a busy neighbour within a few steps, and
the thread governor's probes at another count (which can be many times slower beside a
neighbour) do not distort it. One reweighting pass discounts steps far off the first fit (a
hiccup, a page fault) instead of letting one of them shift every prediction.

When the recent steps all have one shape (say, every step decodes 16 rows), the data cannot
tell the fixed cost from the per-row one; a gentle pull toward a prior *shape* (fixed cost
about one row's, a row's cost split evenly between its token and its output), scaled to the
measured times, keeps the fit sensible there and vanishes once the shapes vary.
"""
from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np

from engine.ownership import SingleWriter
from engine.tuning import (
    STEP_COST_DECAY, STEP_COST_MIN_STEPS, STEP_COST_PRIOR_PULL, STEP_COST_PRIOR_SHAPE, STEP_COST_REFIT_MISS,
    STEP_COST_REFIT_STEPS, STEP_COST_WINDOW,
)

_PRIOR_SHAPE = np.array(STEP_COST_PRIOR_SHAPE)


class StepCost(NamedTuple):
    fixed_s: float
    per_token_s: float
    per_output_s: float
    multi_output_s: float = 0.0  # paid once by a step with two output rows or more

    def seconds(self, tokens: int, outputs: int) -> float:
        return (self.fixed_s + self.per_token_s * tokens + self.per_output_s * outputs
                + (self.multi_output_s if outputs > 1 else 0.0))


class StepCostModel(SingleWriter):
    """Fed by the engine core after every completed step; read by the scheduling policy. Engine
    thread only."""

    def __init__(self) -> None:
        self._steps: collections.deque[tuple[int, int, float, int]] = collections.deque(maxlen=STEP_COST_WINDOW)
        self._fits: dict[int | None, StepCost] = {}
        self._since_fit = 0  # steps recorded since the fits were cleared
        self._jump_share = 0.0  # multi_output_s over a one-row step, as last seen in steps of both kinds
        self._expected_threads: int | None = None

    def record(self, tokens: int, outputs: int, seconds: float, threads: int = 0) -> None:
        self._steps.append((tokens, outputs, seconds, threads))
        self._since_fit += 1
        # A refit costs most of a millisecond, and a step that the fit predicts well adds little
        # to it: refit (lazily, when a prediction is asked for) after a few steps, or at once
        # when this one was far off the prediction (the machine's speed changed).
        fit = self._fits.get(threads, self._fits.get(self._expected_threads))
        if (fit is None or self._since_fit >= STEP_COST_REFIT_STEPS
                or abs(fit.seconds(tokens, outputs) - seconds) > STEP_COST_REFIT_MISS * seconds):
            self._fits.clear()
            self._since_fit = 0

    def expect_threads(self, threads: int) -> None:
        """The thread count the coming steps will normally run with (the thread governor's)."""
        self._expected_threads = threads

    def estimate(self, threads: int | None = None) -> StepCost | None:
        """The fit for steps run with `threads` (default: the expected count; all steps while
        fewer than a few ran with it), or None before any step has been seen."""
        threads = self._expected_threads if threads is None else threads
        if threads not in self._fits and self._steps:
            same = [s for s in self._steps if s[3] == threads] if threads is not None else []
            steps = same if len(same) >= STEP_COST_MIN_STEPS else list(self._steps)
            fit = _fit(steps)
            several = any(s[1] > 1 for s in steps)
            if several and any(s[1] == 1 for s in steps):
                self._jump_share = fit.multi_output_s / fit.seconds(1, 1)
            elif self._jump_share and not several:
                # One stream that stopped drafting: the jump it measured still holds, as a share
                # of its step; forgetting it would have it draft again to find out anew.
                fit = fit._replace(multi_output_s=self._jump_share * fit.seconds(1, 1))
            self._fits[threads] = fit
        return self._fits.get(threads)


def _fit(steps: list[tuple[int, int, float, int]]) -> StepCost:
    data = np.array([s[:3] for s in steps], dtype=np.float64)
    x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1], data[:, 1] > 1])
    y = data[:, 2]
    w = STEP_COST_DECAY ** np.arange(len(data) - 1, -1, -1, dtype=np.float64)
    # The prior shape, scaled to fit the measured times as well as one number can.
    shape_pred = x @ _PRIOR_SHAPE
    scale = float(np.sum(w * y * shape_pred) / max(np.sum(w * shape_pred ** 2), 1e-12))
    prior = scale * _PRIOR_SHAPE
    xtw = x.T * w
    gram = xtw @ x
    pull = STEP_COST_PRIOR_PULL * np.maximum(np.diag(gram), 1e-12)
    theta = np.linalg.solve(gram + np.diag(pull), xtw @ y + pull * prior)
    # Steps far off the fit (beyond 4 median absolute residuals, and a fifth of a typical step:
    # the prior's pull alone leaves a few percent) count for little in a refit.
    residual = np.abs(y - x @ theta)
    spread = max(float(np.median(residual)), 0.05 * float(np.median(y)), 1e-6)
    w = w * np.where(residual > 4 * spread, 0.05, 1.0)
    xtw = x.T * w
    gram = xtw @ x
    pull = STEP_COST_PRIOR_PULL * np.maximum(np.diag(gram), 1e-12)
    theta = np.linalg.solve(gram + np.diag(pull), xtw @ y + pull * prior)
    # Negative costs are noise, never physics: fall back to the prior's share of that term.
    theta = np.where(theta > 0, theta, 0.1 * np.maximum(prior, 1e-9))
    return StepCost(*(float(t) for t in theta))
