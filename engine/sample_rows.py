"""Sampling one token for each output row of a step, with logprobs for the rows that ask."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.logprobs import snapshot_rows, token_logprob
from engine.sequence import Sequence
from sampling.sampler import BatchSampler, NoAllowedTokenError, RowContext


class SampledRows(NamedTuple):
    tokens: list[int]  # one per row; negative where the row's grammar had no allowed token
    dead_ends: dict[int, str]  # row -> why it could not be sampled


def sample_rows(sampler: BatchSampler, logits: np.ndarray, seqs: list[Sequence], n_ctx: int) -> SampledRows:
    wanting = [i for i, seq in enumerate(seqs) if seq.logprobs is not None]
    raw = snapshot_rows(logits, wanting)  # the sampler may edit rows in place
    dead_ends: dict[int, str] = {}
    try:
        tokens = sampler.sample_rows(logits, [_row_context(seq, n_ctx) for seq in seqs]).tolist()
    except NoAllowedTokenError as exc:  # only the rows whose grammar hit a dead end fail
        tokens = exc.tokens.tolist()
        dead_ends = {i: str(exc) for i in exc.rows}
    for i in wanting:
        if tokens[i] >= 0:
            seqs[i].logprobs.append(token_logprob(raw[i], tokens[i], seqs[i].request.logprobs))
    return SampledRows(tokens, dead_ends)


def _row_context(seq: Sequence, n_ctx: int) -> RowContext:
    params = seq.request.sampling
    return RowContext(
        params=params,
        rng=seq.rng,
        generated=seq.tokens[seq.n_prompt :] if params.has_penalties else (),
        matcher=seq.matcher,
        remaining_tokens=min(seq.remaining_tokens, n_ctx + 1 - len(seq.tokens)),
    )
