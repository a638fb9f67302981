"""Checking a sequence's drafted tokens against the rows the model computed for them.

The sequence's first output row is sampled with everyone else's (engine/outputs.py); with a
draft d1..dk it owns k more rows, row i computed as if d1..di were already its tokens. Row by
row: sample the model's token as usual (the request's own temperature, top-k/top-p/min-p,
penalties, grammar mask and random generator); if it equals the next drafted token, that token
is kept and the next row is sampled; the first token that differs is kept instead and the rest
of the draft is dropped. For a draft that is fixed in advance this is exactly the speculative
sampling rule (keep d with probability p(d), else draw from p without d), so the output has the
distribution it would have without drafts; under greedy decoding it is the same tokens.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.outputs import append_token, sample_rows
from engine.request import FinishReason
from engine.sequence import Sequence
from sampling.sampler import BatchSampler


class Verified(NamedTuple):
    accepted: int  # drafted tokens kept
    reason: FinishReason | None  # why the sequence ends, if it does
    error: str | None = None  # a dead end of its grammar (reason ERROR)


def verify(sampler: BatchSampler, logits: np.ndarray, seq: Sequence, first: int, draft: tuple[int, ...],
           eog_tokens: frozenset[int], n_ctx: int, forced: tuple[bool, ...] = ()) -> Verified:
    """Append the tokens the model confirms, starting from `first` (sampled from logits[0]);
    logits holds, in order, the rows computed after draft[:i] for each i but those where
    `forced[i]`: there the grammar forces draft[i], which is kept as jump-forward would append it,
    unsampled, once the tokens before it are."""
    if _plain_greedy(seq) and not any(forced):
        return _verify_greedy(logits, seq, draft, eog_tokens, n_ctx)
    token, accepted, row = first, 0, 1
    for i, drafted in enumerate(draft):
        if token != drafted:
            break
        reason = append_token(seq, token, eog_tokens, n_ctx)
        accepted += 1
        if reason is not None:
            return Verified(accepted, reason)
        if i + 1 < len(draft) and forced and forced[i + 1]:
            token = draft[i + 1]
            continue
        sampled = sample_rows(sampler, logits[row:row + 1], [seq], n_ctx)
        row += 1
        if sampled.dead_ends:
            return Verified(accepted, FinishReason.ERROR, sampled.dead_ends[0])
        token = sampled.tokens[0]
    return Verified(accepted, append_token(seq, token, eog_tokens, n_ctx))


def _plain_greedy(seq: Sequence) -> bool:
    params = seq.request.sampling
    return seq.matcher is None and seq.logprobs is None and params.is_greedy and not params.edits_logits


def _verify_greedy(logits: np.ndarray, seq: Sequence, draft: tuple[int, ...], eog_tokens: frozenset[int],
                   n_ctx: int) -> Verified:
    # Every row's choice is its argmax, known at once: no row depends on another's sample.
    best = np.argmax(logits[:len(draft) + 1], axis=1).tolist()
    accepted = 0
    while accepted < len(draft) and best[accepted] == draft[accepted]:
        accepted += 1
    for i, token in enumerate(best[:accepted + 1]):
        reason = append_token(seq, token, eog_tokens, n_ctx)
        if reason is not None:
            return Verified(min(i + 1, accepted), reason)
    return Verified(accepted, None)
