"""Scheduling policies: who is admitted first, who gives way, and how a step is laid out.

The scheduler owns the mechanics (queues, KV reservations, admit / suspend / preempt, chunking);
it asks its policy every question that has more than one defensible answer. Two policies:

- `FifoPolicy`: one queue in arrival order, nobody displaces anybody (the benchmarks' baseline).
- `TwoTierPolicy`: interactive requests first, batch work keeps a guaranteed share.

Why the two-tier rules look the way they do: on a CPU, one step of a full batch of decode rows
takes longer than a short prompt's whole prefill on an idle engine (docs/scheduling.md). So,
while an interactive request reads its prompt:

- an arriving interactive request interrupts the step in flight if that carries no
  interactive prompt (batch decode rows or prompt chunks, interactive rows) and has run less
  than `interrupt_window` (default half) of a typical step of its kind. Later in a step an
  abort wastes more batch work than it saves: llama.cpp checks for an abort only between graph
  nodes, and the last node of a decode step, the output projection over the 262,144-token
  vocabulary, cannot be aborted (bench/abort_floor.py);
- the next step carries the interactive prompts alone, so the prefill runs as on an idle
  engine. Interactive sequences already decoding ride along only when waiting out that step
  would take them past the per-token target (below): a second output row makes a short step
  about half again as long. The step after it plans for what they have waited.

Once interactive sequences decode, each of their tokens waits for one whole step, and a step's
time grows about linearly with its rows. A per-token latency target (`interactive_token_s`)
sets how long such a step may take: the step-cost model (engine/step_cost.py) says how many
batch rows, then batch prompt tokens, fit beside the interactive rows, the least advanced batch
rows first. Intervals are longer than the decode alone (the loop around it, noise), so the plan
divides the target by the 95th percentile of interval / prediction, learned from the intervals
interactive tokens really get. `interactive_batch_rows` optionally caps the rows on top.

For a slot, a batch sequence is suspended (it keeps its KV and resumes without recomputing);
only when KV blocks run short is one released and later recomputed. `batch_min_share` bounds
what batch work pays: it keeps that fraction of running slots and of each step's prompt tokens,
and runs in at least one of every 1/batch_min_share steps.

Within a tier, tenants share by weight (engine/fair_share.py, `fair_share`): the next admission
is the first waiting sequence of the backlogged tenant with the least weighted service, and a
victim is taken from the tenant with the most (then by the rules above). A tenant below its
weighted share of its tier's slots may take one from the tenant furthest above its own. Off, or
with one tenant, the tier's queue is first come, first served.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Protocol

from engine.fair_share import FairShare
from engine.ownership import SingleWriter
from engine.prompt_scores import scored_positions
from engine.request import Priority
from engine.sequence import Sequence
from engine.step_cost import StepCostModel
from engine.step_plan import Chunk, StepPlan
from engine.tuning import (
    CALIBRATION_DOWN, CALIBRATION_RANGE, CALIBRATION_START, CALIBRATION_UP, DEEP_PROMPT_CHUNK, DEEP_PROMPT_FROM,
    DRAFT_TARGET_MARGIN,
)

INTERACTIVE, BATCH = Priority.INTERACTIVE, Priority.BATCH
EMPTY_MAPPING: Mapping[str, int] = MappingProxyType({})


class QueueView(Protocol):
    """What a policy may read of the scheduler's state (it never changes it)."""

    running: list[Sequence]  # in admission order
    max_running: int
    step_token_budget: int

    def waiting_in(self, tier: Priority) -> int: ...

    def head(self, tier: Priority) -> Sequence | None: ...

    def n_running(self, tier: Priority) -> int: ...

    def queue(self, tier: Priority) -> Iterable[Sequence]: ...  # waiting, in queue order


@dataclass
class StepLayout:
    order: list[Sequence]  # the running sequences that feed tokens this step, by rank
    batch_prefill_reserve: int = 0  # prompt tokens interactive prefill leaves to batch prefill
    batch_tokens_left: int | None = None  # batch prompt tokens this step may still carry
    deep_chunk: int | None = None  # at most this many tokens per batch prompt chunk past DEEP_PROMPT_FROM

    def prefill_room(self, seq: Sequence, budget: int) -> int:
        if seq.request.priority is INTERACTIVE:
            return max(1, budget - self.batch_prefill_reserve) if self.batch_prefill_reserve else budget
        room = budget if self.batch_tokens_left is None else min(budget, self.batch_tokens_left)
        if self.deep_chunk is not None and seq.n_computed >= DEEP_PROMPT_FROM:
            room = min(room, self.deep_chunk)
        return room

    def took(self, seq: Sequence, n: int) -> None:
        if seq.request.priority is BATCH and self.batch_tokens_left is not None:
            self.batch_tokens_left -= n


class SchedulingPolicy(SingleWriter):
    """The questions the scheduler asks. This base class answers them as FIFO does. Engine thread only."""

    bounded_steps = 0  # steps laid out under a latency target
    batch_rows_granted = 0  # batch rows those steps carried
    calibration: float | None = None  # how much longer intervals run than predicted steps (p95)
    token_target_s: float | None = None  # the per-token target steps are planned for
    # The longest a step laid out by the last lay_out may be predicted to take once drafts are
    # added to it (engine/speculation.py): None, any; 0, no drafts at all.
    draft_limit_s: float | None = None

    def next_candidate(self, view: QueueView, blocked: set[Priority]) -> Sequence | None:
        """The waiting sequence to try next; `blocked` holds the tiers whose head could not start."""
        if blocked:
            return None  # one queue, one head: nobody jumps ahead of a head that cannot start
        heads = [h for tier in Priority if (h := view.head(tier)) is not None]
        return min(heads, key=lambda s: s.arrival_order, default=None)

    def slot_victim(self, view: QueueView, seq: Sequence) -> Sequence | None:
        """A running sequence to suspend so `seq` gets a slot (None: `seq` waits)."""
        return None

    def kv_victim(self, view: QueueView, seq: Sequence) -> Sequence | None:
        """A running sequence to preempt so `seq` gets KV blocks (None: `seq` waits)."""
        return None

    def may_release_suspended_for(self, seq: Sequence) -> bool:
        """Whether suspended sequences give up their KV so `seq` can be admitted."""
        return False

    def growth_victim(self, view: QueueView) -> Sequence:
        """The running sequence to preempt when the running ones need more KV blocks."""
        return view.running[-1]  # the most recently admitted has the least to recompute

    def ranks_before(self, running: Sequence, candidate: Sequence) -> bool:
        """Whether a running sequence's tokens come before a candidate's in the step budget."""
        return True

    def lay_out(self, view: QueueView) -> StepLayout:
        return StepLayout(order=list(view.running))

    def step_planned(self, view: QueueView, plan: StepPlan) -> bool:
        """Note a planned step; True if an interactive arrival would be worth aborting it for."""
        return False

    def step_drafted(self, plan: StepPlan) -> None:
        """Drafts were attached to the planned step's chunks (engine/speculation.py)."""

    def step_aborted(self, view: QueueView) -> None:
        """The last planned step was interrupted before it finished."""

    def interactive_intervals(self, seconds: list[float]) -> None:
        """Interactive sequences just got tokens, these many seconds after their previous ones."""

    # ---- what the scheduler reports, for policies that share tiers among tenants --------------
    def queued(self, seq: Sequence) -> None:
        """`seq` joined its tier's queue (new, or displaced back into it)."""

    def dequeued(self, seq: Sequence) -> None:
        """`seq` left its tier's queue (admitted, or finished while waiting)."""

    def admitted(self, seq: Sequence) -> None:
        """`seq` starts running (new, resumed, or adopted from the first-token lane)."""

    def computed(self, seq: Sequence, start: int, rows: int) -> None:
        """A completed step (or the first-token lane) computed `rows` of `seq` from `start`."""

    def released(self, seq: Sequence) -> None:
        """`seq` finished or was cancelled, in whatever state."""

    def waiting_by_tenant(self) -> Mapping[str, int]:
        """Tenant → sequences waiting in either tier (empty unless the policy shares by tenant)."""
        return EMPTY_MAPPING

    def may_adopt(self, seq: Sequence) -> bool:
        """Whether a sequence whose prompt was computed elsewhere may run without queuing."""
        return True


class FifoPolicy(SchedulingPolicy):
    pass


class TwoTierPolicy(SchedulingPolicy):
    def __init__(self, max_running: int, step_token_budget: int, batch_min_share: float = 0.25,
                 interrupt_steps: bool = True, interactive_batch_rows: int | None = None,
                 interactive_token_s: float | None = None, step_cost: StepCostModel | None = None,
                 clock: Callable[[], float] = time.perf_counter, fair_share: bool = True) -> None:
        if not 0.0 <= batch_min_share < 1.0:
            raise ValueError(f"batch_min_share must be at least 0 and below 1, got {batch_min_share}")
        if interactive_batch_rows is not None and interactive_batch_rows < 1:
            raise ValueError(f"interactive_batch_rows must be >= 1 (or None: no bound), got {interactive_batch_rows}")
        if interactive_token_s is not None and not 0 < interactive_token_s < float("inf"):
            raise ValueError(f"interactive_token_ms must be positive (or None: no target), got "
                             f"{interactive_token_s * 1000:g}")
        share = batch_min_share
        self.interrupt_steps = interrupt_steps
        # While interactive sequences decode, a step carries at most this many batch tokens.
        self.interactive_batch_rows = interactive_batch_rows
        # ... and no more than the step-cost model says fit within the per-token target. Without
        # a model (a policy built only to check settings) the target cannot be planned for.
        self.token_target_s = interactive_token_s if step_cost is not None else None
        self.step_cost = step_cost
        self._clock = clock
        self.calibration = CALIBRATION_START
        self._predicted_s: float | None = None  # the last bounded step's predicted seconds
        self.bounded_steps = 0
        self.batch_rows_granted = 0
        self._last_step_bounded = False
        self._carried: set[Sequence] = set()  # interactive sequences the last completed step fed
        # Slots and prompt tokens batch work keeps whenever it has work; interactive work always
        # keeps at least one slot of its own.
        self.batch_slots = min(max_running - 1, max(1, round(share * max_running))) if share > 0 else 0
        self.batch_tokens = max(1, round(share * step_token_budget)) if share > 0 else 0
        self.max_batchless_steps = (round(1 / share) - 1) if share > 0 else None
        self._steps_without_batch = 0  # consecutive steps in which waiting batch work made no progress
        self._waited_before_step = 0
        self.fair = FairShare() if fair_share else None  # None: each tier first come, first served

    # ---- admission ----------------------------------------------------------------------------
    def next_candidate(self, view: QueueView, blocked: set[Priority]) -> Sequence | None:
        # A head that cannot start blocks its own tier for this step (nobody behind it jumps
        # ahead, so a large request is never starved by smaller ones), not the other tier.
        order = [INTERACTIVE, BATCH]
        if view.n_running(BATCH) < self.batch_slots:
            order.reverse()  # batch is below its guaranteed share of slots
        for tier in order:
            seq = self._head(view, tier) if tier not in blocked else None
            if seq is None:
                continue
            if tier is INTERACTIVE and not self._interactive_slot_free(view) and not self._swaps_in(view, seq):
                continue
            if tier is BATCH and self._interactive_prefilling(view):
                continue  # it would get no tokens this step; keep its slot and blocks free
            return seq
        return None

    def slot_victim(self, view: QueueView, seq: Sequence) -> Sequence | None:
        # Suspension loses no work, only time, so it falls on the sequence furthest ahead (the
        # most recently admitted of those): the delay is spread over the batch tier instead of
        # holding back one sequence again and again, which would leave it finishing alone in
        # steps of a few rows. max() keeps the first of equals: ties go to the latest admitted.
        # Among tenants, the one with most weighted service gives way first. Failing that, a
        # tenant below its share of its own tier's slots takes one (engine/fair_share.py).
        victim = max(reversed(self._displaceable(view, seq)), key=lambda s: (self._service(s), s.n_generated),
                     default=None)
        if victim is None and self.fair is not None:
            victim = self.fair.swap_victim(view.running, seq)
        return victim

    def kv_victim(self, view: QueueView, seq: Sequence) -> Sequence | None:
        # The most recently admitted has least to recompute (of the most served tenant).
        return max(reversed(self._displaceable(view, seq)), key=self._service, default=None)

    def may_release_suspended_for(self, seq: Sequence) -> bool:
        return seq.request.priority is INTERACTIVE

    def growth_victim(self, view: QueueView) -> Sequence:
        batch = [s for s in view.running if s.request.priority is BATCH]
        return max(reversed(batch or view.running), key=self._service)

    def ranks_before(self, running: Sequence, candidate: Sequence) -> bool:
        return candidate.request.priority is BATCH or running.request.priority is INTERACTIVE

    # ---- step layout --------------------------------------------------------------------------
    def lay_out(self, view: QueueView) -> StepLayout:
        # Stable sort: admission order within a tier.
        order = sorted(view.running, key=lambda s: 0 if s.request.priority is INTERACTIVE else 1)
        now = self._clock()
        self.draft_limit_s = None
        if self._interactive_prefilling(view) and self._batch_may_wait(self._steps_without_batch):
            # Interactive work alone: a short step, as on an idle engine. Interactive sequences
            # already decoding ride along only when waiting out the step would make them miss
            # the target: every output row beyond the first makes the step much longer (the
            # vocabulary's projection stops being one pass over the matrix), and that wait is
            # the arrival's first token.
            prompts = [s for s in order if s.request.priority is INTERACTIVE and not s.is_decoding]
            decoding = [s for s in order if s.request.priority is INTERACTIVE and s.is_decoding]
            riders = decoding if self._must_ride_along(view, prompts, decoding, now) else []
            order = prompts + riders
            self.draft_limit_s = 0.0  # the arrival's first token waits for this step: nothing more in it
        wants = any(s.request.priority is BATCH and not s.is_decoding for s in order)
        # A deep batch prompt's chunk is what an interactive arrival may have to abort.
        layout = StepLayout(order, self.batch_tokens if wants else 0,
                            deep_chunk=DEEP_PROMPT_CHUNK if self.interrupt_steps else None)
        self._last_step_bounded = False
        interactive_decoding = [s for s in order if s.request.priority is INTERACTIVE and s.is_decoding]
        batch = [s for s in order if s.request.priority is BATCH]
        if not interactive_decoding or not batch:
            return layout
        rows, prompt_tokens = self._batch_allowance(interactive_decoding, order, self._waited(interactive_decoding, now))
        if rows is None:
            return layout  # neither a target nor a cap: batch rows ride along freely
        # Batch rows rotate: the least advanced go first, so all progress at the same pace.
        decoding = [s for s in batch if s.is_decoding]
        chosen = set(sorted(decoding, key=lambda s: (s.n_generated, s.arrival_order))[:rows])
        layout.order = [s for s in order if s.request.priority is INTERACTIVE or s in chosen or not s.is_decoding]
        layout.batch_prefill_reserve = 0
        layout.batch_tokens_left = prompt_tokens if prompt_tokens is not None else rows - len(chosen)
        self._last_step_bounded = self.token_target_s is not None
        if self._last_step_bounded:
            self.bounded_steps += 1
            self.batch_rows_granted += len(chosen)
        return layout

    def _must_ride_along(self, view: QueueView, prompts: list[Sequence], decoding: list[Sequence], now: float) -> bool:
        """Whether decoding interactive sequences join a step of interactive prompts, because
        waiting for it and then for a step of their own would take them past the target."""
        if not decoding:
            return False
        cost = self.step_cost.estimate() if self.token_target_s is not None else None
        if cost is None:
            return True  # nothing to plan with: a step later could be any length
        room, prompt_tokens, prompt_outputs = view.step_token_budget, 0, 0
        for seq in prompts:
            n = min(seq.n_pending, room)
            room -= n
            prompt_tokens += n
            prompt_outputs += n == seq.n_pending
        alone = cost.seconds(prompt_tokens, max(1, prompt_outputs)) + \
            cost.seconds(sum(s.n_pending for s in decoding), len(decoding))
        return self._waited(decoding, now) + self.calibration * alone > self.token_target_s

    def _batch_allowance(self, interactive: list[Sequence], order: list[Sequence],
                         waited: float) -> tuple[int | None, int | None]:
        """Batch decode rows, and batch prompt tokens (None: whatever rows leave of the cap), a
        step may carry beside the interactive rows, which have waited `waited` seconds already."""
        cap = self.interactive_batch_rows
        cost = self.step_cost.estimate() if self.token_target_s is not None else None
        if cost is None:
            return cap, None
        budget = (self.token_target_s - waited) / self.calibration
        self.draft_limit_s = budget * (1.0 - DRAFT_TARGET_MARGIN)  # drafts get what the target leaves of the step
        tokens = sum(s.n_pending for s in interactive)
        spare = budget - cost.seconds(tokens, len(interactive))
        row_s = cost.per_token_s + cost.per_output_s
        rows = max(0, int(spare // row_s)) if spare > 0 else 0
        if cap is not None:
            rows = min(rows, cap)
        n_decoding = sum(1 for s in order if s.request.priority is BATCH and s.is_decoding)
        left = spare - min(rows, n_decoding) * row_s
        # A scored prompt's tokens are output rows too.
        scoring = any(s.request.priority is BATCH and s.scores_prompt and not s.is_decoding for s in order)
        prompt_token_s = row_s if scoring else cost.per_token_s
        prompt_tokens = max(0, int(left // prompt_token_s)) if left > 0 else 0
        if not self._batch_may_wait(self._steps_without_batch):
            # Batch work's floor: progress in 1 of every 1/batch_min_share steps, decoding or prefilling.
            rows, prompt_tokens = max(rows, 1), max(prompt_tokens, self.batch_tokens)
        return rows, prompt_tokens

    def step_planned(self, view: QueueView, plan: StepPlan) -> bool:
        self._predict(plan)
        self._carried = {c.seq for c in plan.chunks if c.seq.request.priority is INTERACTIVE}
        waited = self._steps_without_batch
        has_batch = any(c.seq.request.priority is BATCH for c in plan.chunks)
        self._waited_before_step = waited
        self._steps_without_batch = 0 if has_batch or not _batch_running(view) else waited + 1
        # Steps of batch work, decode rows or prompt chunks, may be interrupted (early in them,
        # the window decides, so redoing one costs at most part of a step; a long prompt's chunk
        # would otherwise hold a chat for a whole step), never one carrying an interactive prompt,
        # never while batch work has already waited its bound (that keeps arrivals faster than a
        # step from aborting every step), and only for an arrival that would be admitted right
        # away. The running set cannot change until the step ends, so this answer holds for the
        # whole step. A step under the latency target may be aborted too: its interactive rows
        # then get their tokens in the arrival's prompt step, which carries them.
        return (
            self.interrupt_steps and not self._interactive_prefilling(view)
            and self._batch_may_wait(waited) and self._interactive_slot_free(view)
        )

    def step_drafted(self, plan: StepPlan) -> None:
        # The interval the calibration learns from is the drafted step's: without its draft rows
        # in the prediction, every drafted step would look like a miss and shrink later budgets.
        self._predict(plan)

    def _predict(self, plan: StepPlan) -> None:
        if self._last_step_bounded and (cost := self.step_cost.estimate()) is not None:
            self._predicted_s = cost.seconds(plan.n_tokens, sum(_outputs(c) for c in plan.chunks))

    def step_aborted(self, view: QueueView) -> None:
        self._carried = set()
        if _batch_running(view):
            self._steps_without_batch = self._waited_before_step + 1

    def interactive_intervals(self, seconds: list[float]) -> None:
        # Only steps the target shaped tell how far the prediction was from the interval.
        if not self._last_step_bounded or not self._predicted_s:
            return
        low, high = CALIBRATION_RANGE
        for interval in seconds:
            if interval > self._predicted_s * self.calibration:
                self.calibration = min(high, self.calibration * (1 + CALIBRATION_UP))
            else:
                self.calibration = max(low, self.calibration * (1 - CALIBRATION_DOWN))

    # ---- fair share within a tier --------------------------------------------------------------
    def queued(self, seq: Sequence) -> None:
        if self.fair is not None:
            self.fair.queued(seq)

    def dequeued(self, seq: Sequence) -> None:
        if self.fair is not None:
            self.fair.dequeued(seq)

    def admitted(self, seq: Sequence) -> None:
        if self.fair is not None:
            self.fair.admitted(seq)

    def computed(self, seq: Sequence, start: int, rows: int) -> None:
        if self.fair is not None:
            self.fair.computed(seq, start, rows)

    def released(self, seq: Sequence) -> None:
        if self.fair is not None:
            self.fair.released(seq)

    def waiting_by_tenant(self) -> Mapping[str, int]:
        return EMPTY_MAPPING if self.fair is None else self.fair.waiting_by_tenant()

    def may_adopt(self, seq: Sequence) -> bool:
        # The first-token lane must not be a way past the tier's queue for a tenant that is
        # ahead of the others: such a sequence queues (and recomputes its short prompt).
        return self.fair is None or self.fair.may_go_ahead(seq)

    def _head(self, view: QueueView, tier: Priority) -> Sequence | None:
        """The tier's next sequence: its queue's head, or with several tenants waiting, the
        first waiting sequence of the least served (displaced ones stand first in the queue);
        with no slot free, first that of a tenant below its share of the tier's slots."""
        if self.fair is None:
            return view.head(tier)
        if not self._slot_free(view, tier):
            short = self.fair.short_of_slots(view.running, tier)
            if short:  # with every slot taken, a tenant below its share of them comes first
                return next(s for s in view.queue(tier) if s.request.tenant == short[0])
        least = self.fair.least_served(tier)
        if least is None:
            return view.head(tier)
        return next((s for s in view.queue(tier) if s.request.tenant in least), None)

    def _swaps_in(self, view: QueueView, seq: Sequence) -> bool:
        # Only with every slot taken: a free one kept for batch work is not the tier's to swap.
        return (self.fair is not None and len(view.running) >= view.max_running
                and self.fair.swap_victim(view.running, seq) is not None)

    def _slot_free(self, view: QueueView, tier: Priority) -> bool:
        if tier is INTERACTIVE:
            return self._interactive_slot_free(view)
        return len(view.running) < view.max_running

    def _service(self, seq: Sequence) -> float:
        return self.fair.of(seq) if self.fair is not None else 0.0

    # ---- helpers ------------------------------------------------------------------------------
    def _waited(self, decoding: list[Sequence], now: float) -> float:
        """How long the longest-waiting of these decoding sequences has waited for its next token,
        counting only those a step left out (an aborted one, another's prompt): after a step that
        fed them, the loop's own time is in the calibration already."""
        return max((now - s.last_token_at for s in decoding
                    if s not in self._carried and s.last_token_at is not None), default=0.0)

    def _displaceable(self, view: QueueView, seq: Sequence) -> list[Sequence]:
        if seq.request.priority is not INTERACTIVE or view.n_running(BATCH) <= self.batch_slots:
            return []
        return [s for s in view.running if s.request.priority is BATCH]

    def _interactive_slot_free(self, view: QueueView) -> bool:
        batch_demand = view.n_running(BATCH) + view.waiting_in(BATCH)
        return view.n_running(INTERACTIVE) < view.max_running - min(self.batch_slots, batch_demand)

    def _interactive_prefilling(self, view: QueueView) -> bool:
        return any(s.request.priority is INTERACTIVE and not s.is_decoding for s in view.running)

    def _batch_may_wait(self, waited: int) -> bool:
        """Batch work may be held back (or its step put at risk of interruption) unless it has
        already gone `waited` >= 1 / batch_min_share - 1 steps in a row without progress."""
        bound = self.max_batchless_steps
        return bound is None or waited < bound


def _outputs(chunk: Chunk) -> int:
    """Rows of a chunk that produce logits: its sampling row, its drafted tokens' rows, and the
    rows of a scored prompt."""
    return len(scored_positions(chunk)) + int(chunk.wants_logits) + len(chunk.draft)


def _batch_running(view: QueueView) -> bool:
    return any(s.request.priority is BATCH for s in view.running)
