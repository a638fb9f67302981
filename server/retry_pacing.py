"""How long a client refused for its tenant's in-flight limit is told to wait (`Retry-After`).

A slot frees when one of the tenant's requests ends, which no one can know in advance. A fixed
short wait makes a tenant that keeps far more requests going than its limit send refusals at the
server as fast as its clients' count over that wait, and every refusal costs the machine's cores
what any HTTP request costs them, which the engine's decode feels beside it (docs/tenants.md).
So the wait adapts per tenant: the refused clients should come back about RETRIES_PER_FREED_SLOT
times for each request of the tenant that ends. Retries then find a freed slot within about
1/RETRIES_PER_FREED_SLOT of the time between the tenant's completions, and the refusal rate
follows the tenant's own pace, not the number of its clients.

By Little's law the refused clients waiting number (refusal rate x wait), so scaling the wait by
(refusals / wanted refusals) over a period sets the rate where it is wanted in one step for a
steady crowd; each step is bounded, and a period lasts at least one wait, so the retries the last
wait scheduled have come back before they are counted.
"""
from __future__ import annotations

RETRIES_PER_FREED_SLOT = 8
MIN_WAIT_S = 1.0
MAX_WAIT_S = 60.0  # every openai SDK release honours this (older ones cap at 60 s, 3.x at 120 s)
PERIOD_S = 2.0
MAX_STEP = 4.0  # the most a period scales the wait, up or down


class RetryPacer:
    """One tenant's wait for refusals of its in-flight limit; its caller holds the lock."""

    def __init__(self) -> None:
        self.wait_s = MIN_WAIT_S
        self._refused = 0
        self._freed = 0
        self._since: float | None = None  # the current period's start: the first event's time

    def refused(self, now: float) -> float:
        """One refusal now: the wait to tell it."""
        self._refused += 1
        self._adjust(now)
        return self.wait_s

    def freed(self, now: float) -> None:
        """One of the tenant's requests ended (or was refunded): a slot is free."""
        self._freed += 1
        self._adjust(now)

    def _adjust(self, now: float) -> None:
        if self._since is None:
            self._since = now
        if now - self._since < max(PERIOD_S, self.wait_s):
            return
        wanted = RETRIES_PER_FREED_SLOT * max(self._freed, 1)
        step = min(MAX_STEP, max(1 / MAX_STEP, self._refused / wanted))
        self.wait_s = min(MAX_WAIT_S, max(MIN_WAIT_S, self.wait_s * step))
        self._refused = self._freed = 0
        self._since = now
