"""How often drafted tokens are kept, per draft source and per length of the match a draft
continues.

The i-th token of a draft whose match was m tokens is guessed from a match of m + i - 1 tokens
once those before it were kept, so its chance of being kept is the rate of that length's bucket
times the chances of the tokens before it. Rates are moving averages of the outcomes of verified
drafts and of proposals judged against the tokens that followed them, shared by all sequences:
a sequence's own text says little in a few dozen tokens, and what the match length says holds
across requests (a long match is a passage being copied).
"""
from __future__ import annotations

import bisect

from engine.drafts import SOURCES, Draft
from engine.ownership import SingleWriter
from engine.tuning import ACCEPTANCE_PRIORS, ACCEPTANCE_WEIGHT, MATCH_BUCKETS


class AcceptanceRates(SingleWriter):
    """Engine thread only. `rates[source][b]`: the kept share of drafted tokens guessed from a
    match in bucket b (MATCH_BUCKETS)."""

    def __init__(self, priors: tuple[float, ...] = ACCEPTANCE_PRIORS, weight: float = ACCEPTANCE_WEIGHT) -> None:
        assert len(priors) == len(MATCH_BUCKETS)
        self.weight = weight
        self.rates: dict[str, list[float]] = {s: list(priors) for s in SOURCES}

    def gains(self, draft: Draft, rows: int) -> list[float]:
        """The expected tokens kept from each of the draft's first `rows` tokens."""
        rates, gains, kept = self.rates[draft.source], [], 1.0
        for i in range(min(rows, len(draft.tokens))):
            kept *= rates[_bucket(draft.match, i)]
            gains.append(kept)
        return gains

    def learn(self, draft: Draft, kept: int) -> None:
        """The draft's first `kept` tokens were right, and the next (if any) wrong."""
        rates, w = self.rates[draft.source], self.weight
        for i in range(min(kept + 1, len(draft.tokens))):
            b = _bucket(draft.match, i)
            rates[b] += w * ((1.0 if i < kept else 0.0) - rates[b])


def _bucket(match: int, i: int) -> int:
    """The bucket of the draft's i-th token (from 0): a copy's match grows with each kept token."""
    return bisect.bisect_right(MATCH_BUCKETS, match + i if match else 0) - 1
