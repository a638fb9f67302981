"""Decides, before each step, which sequences feed which tokens.

Each step: make KV room for every running sequence's next token (preempting when blocks run
out), admit waiting requests while slots, KV blocks and the step's token budget allow, then lay
out the step: decoding rows first, then prompt chunks. KV blocks are reserved in the ledger
before llama_decode ever sees a token, so it never has to discover that the cache is full.

Two priority tiers (see engine/priority.py for the policy and its knobs): interactive requests
are admitted first and may displace batch sequences: for a slot, the batch sequence furthest
ahead is *suspended* (back at the head of its queue, keeping its seq id and KV cells, so it
resumes without recomputing); for KV blocks, suspended ones are released first, then running
batch sequences are preempted (released, recomputed later). While one of them is
still reading its prompt, steps carry interactive work only, so its first token comes after one
short step instead of one long mixed one. Batch work keeps a guaranteed share of slots, of
prompt tokens and of steps, so it never starves. A preempted sequence keeps its tokens and
output, returns to the head of its queue and recomputes later (through the prefix cache when
its blocks are still there).
"""
from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass, field

from engine.kv_cache import KvCache
from engine.priority import PriorityPolicy
from engine.request import Priority
from engine.sequence import Sequence, SequenceState

INTERACTIVE, BATCH = Priority.INTERACTIVE, Priority.BATCH


@dataclass
class Chunk:
    seq: Sequence
    start: int  # index into seq.tokens, equal to the KV position of its first token
    length: int

    @property
    def wants_logits(self) -> bool:
        return self.start + self.length == len(self.seq.tokens)


@dataclass
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    interruptible: bool = False  # an arriving interactive request may abort this step

    @property
    def n_tokens(self) -> int:
        return sum(c.length for c in self.chunks)


@dataclass
class TierCounters:
    preemptions: int = 0  # times a sequence of this tier was preempted
    admitted: int = 0


class Scheduler:
    def __init__(
        self,
        kv: KvCache,
        max_running: int,
        step_token_budget: int,
        policy: PriorityPolicy | None = None,
    ) -> None:
        self.kv = kv
        self.max_running = max_running
        self.step_token_budget = step_token_budget
        self.policy = policy or PriorityPolicy()
        self.waiting: dict[Priority, collections.deque[Sequence]] = {
            p: collections.deque() for p in Priority
        }
        self.running: list[Sequence] = []  # in admission order
        self.tiers = {p: TierCounters() for p in Priority}
        self.tokens_prefilled = 0  # prompt (and recomputed) tokens fed to llama_decode
        self._arrivals = itertools.count()
        self._steps_without_batch = 0  # consecutive steps in which waiting batch work made no progress
        self._waited_before_step = 0
        # Slots and prompt tokens batch work keeps whenever it has work (0 with the share off).
        share = self.policy.batch_min_share if self.policy.enabled else 0.0
        # (interactive work always keeps at least one slot of its own)
        self._batch_slots = min(max_running - 1, max(1, round(share * max_running))) if share > 0 else 0
        self._batch_tokens = max(1, round(share * step_token_budget)) if share > 0 else 0
        self._max_batchless_steps = (round(1 / share) - 1) if share > 0 else None

    @property
    def preemptions(self) -> int:
        return sum(t.preemptions for t in self.tiers.values())

    @property
    def n_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def n_running(self, tier: Priority) -> int:
        return sum(1 for s in self.running if s.request.priority is tier)

    def add(self, seq: Sequence) -> None:
        seq.state = SequenceState.WAITING
        seq.arrival = next(self._arrivals)
        self.waiting[seq.request.priority].append(seq)

    def has_work(self) -> bool:
        return bool(self.running) or self.n_waiting > 0

    def schedule(self) -> StepPlan:
        self._make_room_for_growth()
        self._admit_waiting()
        return self._lay_out_step()

    def finish(self, seq: Sequence) -> None:
        """Take a finished or cancelled sequence out, freeing its KV before its id can be reused."""
        if seq.state is SequenceState.RUNNING:
            self.running.remove(seq)
            self.kv.release(seq, keep_prefix=True)
        elif seq.state is SequenceState.SUSPENDED:
            self.waiting[seq.request.priority].remove(seq)
            self.kv.release(seq, keep_prefix=True)
        elif seq.state is SequenceState.WAITING:
            self.waiting[seq.request.priority].remove(seq)
        seq.state = SequenceState.FINISHED

    def preempt(self, seq: Sequence) -> None:
        """Put a running sequence back at the head of its queue; it keeps its tokens and output."""
        self.running.remove(seq)
        self.kv.release(seq, keep_prefix=True)  # its recompute can then start from the cache
        seq.n_computed = 0
        seq.preemptions += 1
        self.tiers[seq.request.priority].preemptions += 1
        seq.state = SequenceState.WAITING
        self._requeue(seq)

    def suspend(self, seq: Sequence) -> None:
        """Give up a running sequence's slot but keep its KV: it waits at the head of its queue
        and resumes where it stopped (released like a preempted one if KV runs short)."""
        self.running.remove(seq)
        seq.preemptions += 1
        self.tiers[seq.request.priority].preemptions += 1
        seq.state = SequenceState.SUSPENDED
        self._requeue(seq)

    def _requeue(self, seq: Sequence) -> None:
        """Back to the head of its queue, among the other displaced sequences in arrival order:
        displaced work resumes first come, first served, so none is passed over indefinitely."""
        queue = self.waiting[seq.request.priority]
        i = 0
        while i < len(queue) and queue[i].admitted_at is not None and queue[i].arrival < seq.arrival:
            i += 1
        queue.insert(i, seq)

    def _release_suspended(self) -> bool:
        """Free the KV of the suspended sequence that will resume last (it will recompute);
        False if none."""
        for tier in (BATCH, INTERACTIVE):
            for seq in reversed(self.waiting[tier]):
                if seq.state is SequenceState.SUSPENDED:
                    self.kv.release(seq, keep_prefix=True)
                    seq.n_computed = 0
                    seq.state = SequenceState.WAITING
                    return True
        return False

    def interactive_can_start(self) -> bool:
        """Whether an interactive request arriving now would be admitted at the next step (so
        interrupting the step in flight for it is worth it)."""
        return self.policy.enabled and self.n_running(INTERACTIVE) < self._interactive_slot_cap()

    # ---- admission ----------------------------------------------------------------------------
    def _admit_waiting(self) -> None:
        # A head that cannot start blocks its own tier for this step (nobody behind it jumps
        # ahead, so a large request is never starved by smaller ones), not the other tier.
        blocked: set[Priority] = set()
        while (seq := self._next_candidate(blocked)) is not None:
            if not self._try_admit(seq):
                if not self.policy.enabled:
                    return  # FIFO: one queue, one head
                blocked.add(seq.request.priority)

    def _next_candidate(self, blocked: set[Priority]) -> Sequence | None:
        heads = {p: q[0] for p, q in self.waiting.items() if q and p not in blocked}
        if not heads:
            return None
        if not self.policy.enabled:  # FIFO: arrival order, tiers ignored
            return min(heads.values(), key=lambda s: s.arrival)
        order = [INTERACTIVE, BATCH]
        if self.n_running(BATCH) < self._batch_slots:
            order.reverse()  # batch is below its guaranteed share of slots
        for tier in order:
            seq = heads.get(tier)
            if seq is None:
                continue
            if tier is INTERACTIVE and self.n_running(INTERACTIVE) >= self._interactive_slot_cap():
                continue
            if tier is BATCH and self._interactive_prefilling():
                continue  # it would get no tokens this step; keep its slot and blocks free
            return seq
        return None

    def _try_admit(self, seq: Sequence) -> bool:
        if self._budget_ahead_of(seq) <= 0:
            return False
        while True:
            if len(self.running) >= self.max_running:
                victim = self._suspension_victim(seq)
                if victim is None:
                    return False
                self.suspend(victim)  # a slot is all it needs: the victim keeps its KV
                continue
            if seq.state is SequenceState.SUSPENDED or self.kv.try_admit(seq):
                break
            # KV blocks (or seq ids) are short: suspended sequences give theirs up first.
            if self._may_displace(seq) and self._release_suspended():
                continue
            victim = self._victim_for(seq)
            if victim is None:
                return False
            self.preempt(victim)
        self.waiting[seq.request.priority].remove(seq)
        seq.state = SequenceState.RUNNING
        if seq.admitted_at is None:
            seq.admitted_at = time.perf_counter()
        self.tiers[seq.request.priority].admitted += 1
        self.running.append(seq)
        return True

    def _may_displace(self, seq: Sequence) -> bool:
        return self.policy.enabled and seq.request.priority is INTERACTIVE

    def _victim_for(self, seq: Sequence) -> Sequence | None:
        """The batch sequence an interactive one may release for KV blocks: the most recently
        admitted, which has the least to recompute, and only while batch keeps its guaranteed
        slots."""
        batch = self._displaceable_batch(seq)
        return batch[-1] if batch else None

    def _suspension_victim(self, seq: Sequence) -> Sequence | None:
        """The batch sequence an interactive one may take a slot from. Suspension loses no work,
        only time, so it falls on the one furthest ahead (the most recently admitted of those):
        the delay is spread over the batch tier instead of holding back the same sequence again
        and again, which would also leave it to finish alone in steps of a few rows."""
        batch = self._displaceable_batch(seq)
        # max() keeps the first of equals, so over the reversed list ties go to the latest admitted
        return max(reversed(batch), key=lambda s: s.n_generated, default=None)

    def _displaceable_batch(self, seq: Sequence) -> list[Sequence]:
        if not self._may_displace(seq) or self.n_running(BATCH) <= self._batch_slots:
            return []
        return [s for s in self.running if s.request.priority is BATCH]

    def _budget_ahead_of(self, seq: Sequence) -> int:
        """Step tokens left for `seq` after the work that comes before it in this step."""
        ahead = [s for s in self.running if self._ranks_before(s, seq)]
        decode_rows = sum(1 for s in self.running if s.n_pending == 1)
        prefill = sum(s.n_pending for s in ahead if s.n_pending > 1)
        return self.step_token_budget - decode_rows - prefill

    def _ranks_before(self, running: Sequence, candidate: Sequence) -> bool:
        if not self.policy.enabled or candidate.request.priority is BATCH:
            return True
        return running.request.priority is INTERACTIVE

    def _interactive_slot_cap(self) -> int:
        batch_demand = self.n_running(BATCH) + len(self.waiting[BATCH])
        return self.max_running - min(self._batch_slots, batch_demand)

    # ---- growth ---------------------------------------------------------------------------------
    def _make_room_for_growth(self) -> None:
        # Every running sequence will hold all of its tokens after this step; when blocks run
        # out, the most recently admitted batch sequence goes first, then interactive ones.
        for seq in list(self.running):
            while seq.state is SequenceState.RUNNING and not self.kv.try_reserve(seq, len(seq.tokens)):
                if self._release_suspended():
                    continue
                if len(self.running) == 1:
                    break  # alone and still short: it finishes at the context limit instead
                self.preempt(self._growth_victim())

    def _growth_victim(self) -> Sequence:
        if self.policy.enabled:
            batch = [s for s in self.running if s.request.priority is BATCH]
            if batch:
                return batch[-1]
        return self.running[-1]

    # ---- step layout --------------------------------------------------------------------------
    def _interactive_prefilling(self) -> bool:
        return self.policy.enabled and any(
            s.request.priority is INTERACTIVE and s.n_pending > 1 for s in self.running
        )

    def _lay_out_step(self) -> StepPlan:
        waited = self._steps_without_batch
        prefilling = self._interactive_prefilling()
        exclusive = prefilling and self._batch_may_wait(waited)
        plan = StepPlan()
        budget = self.step_token_budget
        ordered = sorted(self.running, key=self._step_rank) if self.policy.enabled else self.running
        if exclusive:  # the prompts alone: a short step, as on an idle engine
            ordered = [s for s in ordered if s.request.priority is INTERACTIVE and s.n_pending > 1]
        # Decoding rows first, so a long prefill never stalls sequences that are generating.
        for seq in ordered:
            if seq.n_pending == 1:
                plan.chunks.append(Chunk(seq, seq.n_computed, 1))
                budget -= 1
                if seq.n_generated == 0:  # the last prompt token, not a sampled one
                    self.tokens_prefilled += 1
        batch_reserve = self._batch_prefill_reserve(ordered)
        for seq in ordered:
            if seq.n_pending > 1 and budget > 0:
                room = budget
                if seq.request.priority is INTERACTIVE:
                    room = max(1, budget - batch_reserve)
                budget -= self._prefill_chunk(plan, seq, room)
        # Only cheap steps may be interrupted: pure decode steps (redoing one costs a fraction
        # of a step), never while batch work has already waited its bound (that is what keeps
        # arrivals faster than a step from aborting every step).
        plan.interruptible = (
            self.policy.enabled and self.policy.interrupt_steps and not prefilling
            and all(c.length == 1 for c in plan.chunks) and self._batch_may_wait(waited)
        )
        has_batch = any(c.seq.request.priority is BATCH for c in plan.chunks)
        self._waited_before_step = waited
        self._steps_without_batch = 0 if has_batch or not self._batch_has_work() else waited + 1
        return plan

    def step_aborted(self) -> None:
        """The last planned step was interrupted: batch work in it made no progress."""
        if self._batch_has_work():
            self._steps_without_batch = self._waited_before_step + 1

    def _step_rank(self, seq: Sequence) -> int:
        return 0 if seq.request.priority is INTERACTIVE else 1  # stable: admission order within

    def _batch_may_wait(self, waited: int) -> bool:
        """Batch work may be held back (or its step put at risk of interruption) unless it has
        already gone `waited` >= 1 / batch_min_share - 1 steps in a row without progress."""
        bound = self._max_batchless_steps
        return bound is None or waited < bound

    def _batch_has_work(self) -> bool:
        return any(s.request.priority is BATCH for s in self.running)

    def _batch_prefill_reserve(self, ordered: list[Sequence]) -> int:
        if not self.policy.enabled:
            return 0
        wants = any(s.request.priority is BATCH and s.n_pending > 1 for s in ordered)
        return self._batch_tokens if wants else 0

    def _prefill_chunk(self, plan: StepPlan, seq: Sequence, budget: int) -> int:
        n = min(seq.n_pending, budget)
        plan.chunks.append(Chunk(seq, seq.n_computed, n))
        self.tokens_prefilled += n
        return n
