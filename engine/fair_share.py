"""Fair sharing within a tier: virtual token counters per tenant (Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024: the Virtual Token Counter).

Each tenant of a tier has a counter of the service it received there: every token computed for
one of its sequences (prompt, recomputed prompt after a preemption, generated, drafted) adds
1 / weight. The prompt (what an admitted sequence has yet to compute) counts when it is admitted,
as in the paper, so several slots freed at once do not all go to the tenant that was least served
before any of them. So does the output the tenant's answers typically run to (a moving average
over its finished requests, within the request's max_tokens): answers of one length end together,
and slots freed together were otherwise split by prompt lengths alone, one tenant holding a slot
or two more for a whole wave of answers. Generated tokens past that estimate count as the step
that computes them completes, and what was charged ahead but never computed is given back when
the request ends.
Among the tier's *backlogged* tenants (with a sequence waiting in its queue), admission goes to
the one whose counter is least, so tenants that stay backlogged are served tokens in proportion
to their weights, and a tenant alone gets everything (nobody else's counter can hold it back:
the rule only orders who waits).

Counters order who gets a slot that frees. Slots free in waves, though, when answers run to
one length: a tenant whose next request arrives just after a wave would wait out the whole next
wave however little it had been served. So a tenant below its weighted share of the tier's slots
(with the new sequence too) may take a slot from the tenant furthest above its own share, when
that one stays at or above it: the victim is suspended (it keeps its KV) and resumes when a slot
frees. Shares of slots converge at once and nobody's swap can be swapped back.

A tenant that joins the backlog is lifted to the least counter of the backlogged tenants (to
the counter of the tenant that left the queue last, when none is waiting), never lowered: time
spent idle is not banked as a claim on the tier later.

Engine thread only (the policy that holds it is called from the scheduler).
"""
from __future__ import annotations

from engine.ownership import SingleWriter
from engine.request import FinishReason, Priority
from engine.sequence import Sequence, SequenceState
from engine.tuning import TYPICAL_OUTPUT_WEIGHT

# Counters of tenants that are neither waiting nor ahead of the floor carry no information (they
# would be lifted on return anyway): past this many, they are forgotten, so a Python caller
# naming a new tenant in every request cannot grow the table without bound.
KEPT_IDLE_TENANTS = 256
ANSWER_ENDS = frozenset({FinishReason.STOP, FinishReason.LENGTH, FinishReason.CONTEXT_LENGTH})


class FairShare(SingleWriter):
    """Virtual token counters, per tier and tenant."""

    def __init__(self) -> None:
        self.service: dict[Priority, dict[str, float]] = {p: {} for p in Priority}
        self._waiting: dict[Priority, dict[str, int]] = {p: {} for p in Priority}  # backlogged: count > 0
        self._waiting_weight: dict[Priority, dict[str, float]] = {p: {} for p in Priority}  # of the backlogged
        self._last_left: dict[Priority, str | None] = {p: None for p in Priority}
        # Running sequences charged at admission for their tokens up to this position.
        self._prepaid: dict[Sequence, int] = {}
        # Generated tokens charged at admission and not computed yet, per sequence until it ends.
        self._output_ahead: dict[Sequence, int] = {}
        # Generated tokens per finished request: a moving average per tier and tenant.
        self._typical_output: dict[Priority, dict[str, float]] = {p: {} for p in Priority}

    # ---- queue membership (the scheduler reports every change) --------------------------------
    def queued(self, seq: Sequence) -> None:
        """`seq` joined its tier's queue (new, or displaced back into it)."""
        tier, tenant = seq.request.priority, seq.request.tenant
        waiting = self._waiting[tier]
        if not waiting.get(tenant):
            floor = self._floor(tier)
            service = self.service[tier]
            service[tenant] = max(service.get(tenant, 0.0), floor)
            if len(service) > KEPT_IDLE_TENANTS + len(waiting):
                self._forget_idle(tier, floor)
        waiting[tenant] = waiting.get(tenant, 0) + 1
        self._waiting_weight[tier][tenant] = seq.request.weight

    def dequeued(self, seq: Sequence) -> None:
        """`seq` left its tier's queue (admitted, finished, cancelled)."""
        tier, tenant = seq.request.priority, seq.request.tenant
        waiting = self._waiting[tier]
        left = waiting.get(tenant, 0) - 1
        if left > 0:
            waiting[tenant] = left
        else:
            waiting.pop(tenant, None)
            self._waiting_weight[tier].pop(tenant, None)
            self._last_left[tier] = tenant

    def admitted(self, seq: Sequence) -> None:
        """`seq` starts running: it is charged now for the tokens it has yet to compute, its
        prompt's and those its tenant's answers typically run to (once per request: a resumed or
        recomputed sequence keeps what it was charged ahead)."""
        self._charge(seq, len(seq.tokens) - seq.n_computed)
        self._prepaid[seq] = len(seq.tokens)
        if seq not in self._output_ahead:
            typical = self._typical_output[seq.request.priority].get(seq.request.tenant, 0.0)
            ahead = max(0, min(seq.remaining_tokens, round(typical)))
            self._charge(seq, ahead)
            self._output_ahead[seq] = ahead

    def computed(self, seq: Sequence, start: int, rows: int) -> None:
        """A completed step computed `rows` of `seq` from position `start` (or the first-token
        lane its prompt): charged but for what was paid at admission."""
        paid = self._prepaid.get(seq)
        if paid is not None:
            if start + rows >= paid:
                del self._prepaid[seq]
            rows = max(0, start + rows - max(start, paid))
        ahead = self._output_ahead.get(seq, 0)
        if ahead and rows:
            used = min(ahead, rows)
            self._output_ahead[seq] = ahead - used
            rows -= used
        self._charge(seq, rows)

    def released(self, seq: Sequence) -> None:
        """`seq` is finished (or cancelled): what it was charged ahead and never computed is given
        back, and a complete answer's length teaches its tenant's typical output."""
        unused = self._output_ahead.pop(seq, 0)
        paid = self._prepaid.pop(seq, None)
        if paid is not None and seq.state in (SequenceState.RUNNING, SequenceState.SUSPENDED):
            # A prompt cut short (a cancellation mid-prefill). A sequence preempted since keeps
            # its stale entry while it waits, and no refund: it may have computed that prompt.
            unused += max(0, paid - seq.n_computed)
        tier, tenant = seq.request.priority, seq.request.tenant
        service = self.service[tier]
        if unused and tenant in service:
            service[tenant] -= unused / seq.request.weight
        # A cancelled, timed-out or failed answer says nothing of how long the tenant's run.
        if seq.n_generated and seq.finish_reason in ANSWER_ENDS:
            typical = self._typical_output[tier]
            if tenant in typical or len(typical) < KEPT_IDLE_TENANTS + len(self._waiting[tier]):
                before = typical.get(tenant, float(seq.n_generated))
                typical[tenant] = before + TYPICAL_OUTPUT_WEIGHT * (seq.n_generated - before)

    # ---- what the policy asks -----------------------------------------------------------------
    def least_served(self, tier: Priority) -> frozenset[str] | None:
        """The backlogged tenants of `tier` with the least counter (ties all of them); None when
        fewer than two are backlogged, when the queue's own order decides."""
        waiting = self._waiting[tier]
        if len(waiting) < 2:
            return None
        service = self.service[tier]
        least = min(service.get(t, 0.0) for t in waiting)
        return frozenset(t for t in waiting if service.get(t, 0.0) == least)

    def may_go_ahead(self, seq: Sequence) -> bool:
        """Whether `seq`, not queued, may take a slot before the waiting sequences of its tier:
        none waits, or its tenant is not ahead of the least served of those who do."""
        tier, tenant = seq.request.priority, seq.request.tenant
        waiting = self._waiting[tier]
        if not waiting:
            return True
        service = self.service[tier]
        return service.get(tenant, 0.0) <= min(service.get(t, 0.0) for t in waiting)

    def short_of_slots(self, running: list[Sequence], tier: Priority) -> list[str]:
        """The backlogged tenants of `tier` that would take a slot by a swap (`swap_victim`),
        least served first: the tier's next admission when every slot is taken, so one that
        cannot be swapped in (the queue's order) never holds the swap back."""
        slots, weights, per_weight = self._slot_shares(running, tier)
        if not any(n - 1 >= per_weight * weights[t] for t, n in slots.items()):
            return []
        short = [t for t in self._waiting[tier] if slots.get(t, 0) + 1 <= per_weight * weights[t]]
        return sorted(short, key=self.service[tier].get)

    def swap_victim(self, running: list[Sequence], seq: Sequence) -> Sequence | None:
        """A running sequence of `seq`'s tier to suspend for `seq` when every slot is taken: one
        of the tenant furthest above its weighted share of the tier's slots, if it stays at or
        above that share without it and `seq`'s tenant stays at or below its own with `seq`.
        Shares are among the tenants running or waiting in the tier; None with one tenant."""
        tier, tenant = seq.request.priority, seq.request.tenant
        slots, weights, per_weight = self._slot_shares(running, tier, seq)
        if len(weights) < 2 or slots.get(tenant, 0) + 1 > per_weight * weights[tenant]:
            return None
        over = [t for t, n in slots.items() if t != tenant and n - 1 >= per_weight * weights[t]]
        if not over:
            return None
        furthest = max(over, key=lambda t: slots[t] / weights[t])
        # The one furthest ahead (the latest admitted of equals) gives way, as for an interactive
        # arrival: a resumed sequence is admitted last and is not held back again and again.
        return max(reversed([s for s in running if s.request.priority is tier and s.request.tenant == furthest]),
                   key=lambda s: s.n_generated)

    def of(self, seq: Sequence) -> float:
        """The counter of `seq`'s tenant in its tier."""
        return self.service[seq.request.priority].get(seq.request.tenant, 0.0)

    def backlogged(self, tier: Priority) -> dict[str, int]:
        """Tenant → sequences waiting in `tier` (a copy)."""
        return dict(self._waiting[tier])

    def waiting_by_tenant(self) -> dict[str, int]:
        """Tenant → sequences waiting in either tier (a new dict: published as a snapshot)."""
        interactive, batch = self._waiting[Priority.INTERACTIVE], self._waiting[Priority.BATCH]
        if not interactive:
            return dict(batch)
        return {t: interactive.get(t, 0) + batch.get(t, 0) for t in interactive.keys() | batch.keys()}

    # ---- helpers ------------------------------------------------------------------------------
    def _charge(self, seq: Sequence, tokens: int) -> None:
        if tokens > 0:
            service = self.service[seq.request.priority]
            tenant = seq.request.tenant
            service[tenant] = service.get(tenant, 0.0) + tokens / seq.request.weight

    def _slot_shares(self, running: list[Sequence], tier: Priority, seq: Sequence | None = None
                     ) -> tuple[dict[str, int], dict[str, float], float]:
        """Slots held per tenant in `tier`, the weights of the tenants running or waiting there
        (and `seq`'s, which may come from the first-token lane), and the tier's slots per unit
        of weight: a tenant's fair share of slots is its weight times that."""
        slots: dict[str, int] = {}
        weights = dict(self._waiting_weight[tier])
        held = 0
        for s in running:
            if s.request.priority is tier:
                held += 1
                slots[s.request.tenant] = slots.get(s.request.tenant, 0) + 1
                weights[s.request.tenant] = s.request.weight
        if seq is not None:
            weights[seq.request.tenant] = seq.request.weight
        return slots, weights, held / sum(weights.values()) if weights else 0.0

    def _floor(self, tier: Priority) -> float:
        service, waiting = self.service[tier], self._waiting[tier]
        if waiting:
            return min(service.get(t, 0.0) for t in waiting)
        last = self._last_left[tier]
        return service.get(last, 0.0) if last is not None else 0.0

    def _forget_idle(self, tier: Priority, floor: float) -> None:
        service, waiting, last = self.service[tier], self._waiting[tier], self._last_left[tier]
        for tenant in [t for t, c in service.items() if t not in waiting and t != last and c <= floor]:
            del service[tenant]
            self._typical_output[tier].pop(tenant, None)
