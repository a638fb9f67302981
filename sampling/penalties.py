"""Sparse, in-place logit edits: logit_bias and repetition / presence / frequency penalties.

Only the affected token ids of a row are read and written (fancy indexing), never the whole
vocabulary, so a request with penalties costs O(distinct generated tokens) per step.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sampling.params import InvalidParameterError, SamplingParams


def apply_logit_edits(row: np.ndarray, params: SamplingParams, generated: Sequence[int] = ()) -> None:
    """Edit one float32 logits row in place: logit_bias first, then the penalties.

    Penalties count the tokens in `generated` (this request's output so far). For each distinct
    generated token t seen c times: with repetition penalty r, logit /= r if logit > 0 else
    logit *= r (llama.cpp); then logit -= presence * 1 + frequency * c (OpenAI).
    """
    if params.logit_bias:
        ids, values = params.logit_bias_arrays
        if int(ids[-1]) >= row.shape[0]:  # ids are sorted: the last is the largest
            raise InvalidParameterError(
                f"logit_bias token {int(ids[-1])} is outside the vocabulary of {row.shape[0]} tokens"
            )
        row[ids] += values  # ids are distinct, so fancy-index += is exact (no np.add.at needed)
    if not params.has_penalties or len(generated) == 0:
        return
    ids, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
    values = row[ids]
    r = params.repetition_penalty
    if r != 1.0:
        values = np.where(values > 0, values / np.float32(r), values * np.float32(r))
    subtract = params.presence_penalty + params.frequency_penalty * counts.astype(np.float64)
    if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        values = values - subtract.astype(np.float32)
    row[ids] = values
