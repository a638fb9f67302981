"""Decides, before each step, which sequences feed which tokens: the mechanics of scheduling.

Each step: make KV room for every running sequence's next token (preempting when blocks run
out), admit waiting requests while slots, KV blocks and the step's token budget allow, then lay
out the step: decoding rows first, then prompt chunks. KV blocks are reserved in the ledger
before llama_decode ever sees a token, so it never has to discover that the cache is full.

Every choice with more than one defensible answer (who goes first, who gives way, which rows a
step carries) is the policy's (engine/policy.py); the scheduler tells it every change to the
queues and every token computed, for its per-tenant shares (engine/fair_share.py). Giving way comes in two strengths: a
*suspended* sequence gives up its slot but keeps its seq id and KV cells, and resumes without
recomputing; a *preempted* one gives up its KV too, and recomputes later (through the prefix
cache when its blocks are still there). Both keep their tokens and output and go back to the
head of their queue.
"""
from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from engine.kv_cache import KvCache
from engine.ownership import SingleWriter
from engine.policy import FifoPolicy, SchedulingPolicy
from engine.request import Priority
from engine.sequence import Sequence, SequenceState
from engine.step_plan import Chunk, StepPlan


@dataclass
class TierCounters(SingleWriter):
    admitted: int = 0  # admissions, resumptions after suspension or preemption included
    suspensions: int = 0  # times a sequence of this tier gave up its slot and kept its KV
    preemptions: int = 0  # times a sequence of this tier gave up its KV (it recomputes)


class Scheduler(SingleWriter):
    """Engine thread only."""

    def __init__(
        self,
        kv: KvCache,
        max_running: int,
        step_token_budget: int,
        policy: SchedulingPolicy | None = None,
        max_scored_rows: int | None = None,
    ) -> None:
        self.kv = kv
        self.max_running = max_running
        self.step_token_budget = step_token_budget
        self.policy = policy or FifoPolicy()
        self.max_scored_rows = max_scored_rows or step_token_budget  # prompt rows scored per step
        self.waiting: dict[Priority, collections.deque[Sequence]] = {
            p: collections.deque() for p in Priority
        }
        self.running: list[Sequence] = []  # in admission order
        self.tiers = {p: TierCounters() for p in Priority}
        self.tokens_prefilled = 0  # prompt (and recomputed) tokens fed to llama_decode
        self._arrivals = itertools.count()

    # ---- what the policy may read -------------------------------------------------------------
    def waiting_in(self, tier: Priority) -> int:
        return len(self.waiting[tier])

    def head(self, tier: Priority) -> Sequence | None:
        queue = self.waiting[tier]
        return queue[0] if queue else None

    def n_running(self, tier: Priority) -> int:
        return sum(1 for s in self.running if s.request.priority is tier)

    def queue(self, tier: Priority) -> Iterable[Sequence]:
        return iter(self.waiting[tier])

    @property
    def n_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def has_work(self) -> bool:
        return bool(self.running) or self.n_waiting > 0

    # ---- changes ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.state = SequenceState.WAITING
        seq.arrival_order = next(self._arrivals)
        self.waiting[seq.request.priority].append(seq)
        self.policy.queued(seq)

    def adopt(self, seq: Sequence, import_cells: Callable[[int], bool]) -> bool:
        """Run a sequence whose prompt was computed elsewhere. A full set of slots makes room as
        for an admission (the policy's victim is suspended); False, with nothing changed, if there
        is no slot or no KV room for its cells, or the policy keeps the slot for its tier's queue
        (it then computes its prompt here, and would need the slot anyway)."""
        if not self.policy.may_adopt(seq):
            return False
        victim = None
        if len(self.running) >= self.max_running:
            victim = self.policy.slot_victim(self, seq)
            if victim is None:
                return False
        if not self.kv.adopt(seq, import_cells):
            return False
        if victim is not None:
            self.suspend(victim)
        seq.arrival_order = next(self._arrivals)
        self.policy.computed(seq, 0, seq.n_computed)  # its prompt, computed in the lane's context
        self._start_running(seq)
        return True

    def schedule(self) -> StepPlan:
        self._make_room_for_growth()
        self._admit_waiting()
        plan = self._lay_out_step()
        plan.interruptible = self.policy.step_planned(self, plan)
        return plan

    def step_done(self, plan: StepPlan) -> None:
        """The step's tokens are in the KV cache (an aborted step's are not: llama.cpp rolled it back)."""
        for chunk in plan.chunks:
            self.kv.computed(chunk.seq, chunk.length)
            self.policy.computed(chunk.seq, chunk.start, chunk.n_rows)  # drafted rows cost a step as much
        self.tokens_prefilled += plan.prompt_tokens

    def step_aborted(self) -> None:
        self.policy.step_aborted(self)

    def interactive_intervals(self, seconds: list[float]) -> None:
        self.policy.interactive_intervals(seconds)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or cancelled sequence out, freeing its KV before its id can be reused."""
        self.policy.released(seq)  # first: what it computed is still there to read
        if seq.state is SequenceState.RUNNING:
            self.running.remove(seq)
            self.kv.release(seq)
        elif seq.state is SequenceState.SUSPENDED:
            self.waiting[seq.request.priority].remove(seq)
            self.policy.dequeued(seq)
            self.kv.release(seq)
        elif seq.state is SequenceState.WAITING:
            self.waiting[seq.request.priority].remove(seq)
            self.policy.dequeued(seq)
        seq.state = SequenceState.FINISHED

    def preempt(self, seq: Sequence) -> None:
        """Put a running sequence back at the head of its queue without its KV."""
        self.running.remove(seq)
        self._drop_kv(seq)
        self._requeue(seq)

    def kv_full(self) -> Sequence | None:
        """llama.cpp found no KV slot for the step, although the ledger had reserved one (cells
        fragment, or another context shares the memory): make room as the policy says and return
        None, or return the only running sequence, which cannot fit at all."""
        if self._release_suspended():
            return None
        if len(self.running) > 1:
            self.preempt(self.policy.growth_victim(self))
            return None
        return self.running[0] if self.running else None

    def suspend(self, seq: Sequence) -> None:
        """Put a running sequence back at the head of its queue, keeping its KV: it resumes
        where it stopped (unless KV runs short first, and it is released as if preempted)."""
        self.running.remove(seq)
        seq.suspensions += 1
        self.tiers[seq.request.priority].suspensions += 1
        seq.state = SequenceState.SUSPENDED
        self._requeue(seq)

    def _requeue(self, seq: Sequence) -> None:
        """Back to the head of its queue, among the other displaced sequences in arrival order:
        displaced work resumes first come, first served, so none is passed over indefinitely."""
        queue = self.waiting[seq.request.priority]
        i = 0
        while i < len(queue) and queue[i].admitted_at is not None and queue[i].arrival_order < seq.arrival_order:
            i += 1
        queue.insert(i, seq)
        self.policy.queued(seq)

    def _release_suspended(self) -> bool:
        """Free the KV of the suspended sequence that will resume last (it will recompute);
        False if none."""
        for tier in (Priority.BATCH, Priority.INTERACTIVE):
            for seq in reversed(self.waiting[tier]):
                if seq.state is SequenceState.SUSPENDED:
                    self._drop_kv(seq)  # it will recompute: a preemption, late
                    return True
        return False

    def _drop_kv(self, seq: Sequence) -> None:
        """The one place a sequence gives up its KV cells and is counted as preempted."""
        self.kv.release(seq)  # its recompute can then start from the cache
        seq.preemptions += 1
        self.tiers[seq.request.priority].preemptions += 1
        seq.state = SequenceState.WAITING

    # ---- admission ----------------------------------------------------------------------------
    def _admit_waiting(self) -> None:
        blocked: set[Priority] = set()
        while (seq := self.policy.next_candidate(self, blocked)) is not None:
            if not self._try_admit(seq):
                blocked.add(seq.request.priority)

    def _try_admit(self, seq: Sequence) -> bool:
        if self._budget_ahead_of(seq) <= 0 or self._awaits_leader(seq):
            return False
        while True:
            if len(self.running) >= self.max_running:
                victim = self.policy.slot_victim(self, seq)
                if victim is None:
                    return False
                # A swap between tenants of one tier only where KV has room, never at the cost
                # of anyone's recompute: the room is taken before the victim gives way.
                swap = victim.request.priority is seq.request.priority
                if swap and not self._kv_room_for(seq):
                    return False
                self.suspend(victim)  # a slot is all it needs: the victim keeps its KV
                if swap:
                    break
                continue
            if self._kv_room_for(seq):
                break
            # KV blocks (or seq ids) are short: suspended sequences give theirs up first.
            if self.policy.may_release_suspended_for(seq) and self._release_suspended():
                continue
            victim = self.policy.kv_victim(self, seq)
            if victim is None:
                return False
            self.preempt(victim)
        self.waiting[seq.request.priority].remove(seq)
        self.policy.dequeued(seq)
        self._start_running(seq)
        return True

    def _kv_room_for(self, seq: Sequence) -> bool:
        """Blocks for all of seq's tokens: a suspended sequence keeps its own, but may have been
        suspended after the step that gave it its last token (a sequence adopted between steps
        takes its slot), so they may lack the block for that token."""
        if seq.state is SequenceState.SUSPENDED:
            return self.kv.try_reserve(seq, len(seq.tokens))
        return self.kv.try_admit(seq)

    def _start_running(self, seq: Sequence) -> None:
        seq.state = SequenceState.RUNNING
        if seq.admitted_at is None:
            seq.admitted_at = time.perf_counter()
        self.tiers[seq.request.priority].admitted += 1
        self.running.append(seq)
        self.policy.admitted(seq)

    def _budget_ahead_of(self, seq: Sequence) -> int:
        """Step tokens left for `seq` after the work that comes before it in this step."""
        decoding = sum(s.n_pending for s in self.running if s.is_decoding)
        prefill = sum(s.n_pending for s in self.running
                      if not s.is_decoding and self.policy.ranks_before(s, seq))
        return self.step_token_budget - decoding - prefill

    def _awaits_leader(self, seq: Sequence) -> bool:
        """A running sequence is computing prompt blocks that `seq` starts with and the cache
        lacks: `seq` waits the few steps until they are published rather than compute them too.
        A leader that is cancelled or preempted leaves `running`, and with it the wait."""
        if not self.kv.prefix_cache or seq.state is SequenceState.SUSPENDED or seq.scores_prompt:
            return False
        bs = self.kv.block_size
        usable = (len(seq.tokens) - 1) // bs  # a lookup never covers the last token
        for leader in self.running:
            if leader.n_computed >= leader.n_prompt:
                continue  # its prompt is published: admission finds it in the cache
            blocks = min(usable, leader.n_prompt // bs)
            shared = 0
            while shared < blocks and seq.tokens[shared * bs:(shared + 1) * bs] == leader.tokens[shared * bs:(shared + 1) * bs]:
                shared += 1
            if shared * bs > (leader.cached_tokens or 0):
                return True
        return False

    # ---- growth -------------------------------------------------------------------------------
    def _make_room_for_growth(self) -> None:
        # Every running sequence will hold all of its tokens after this step.
        for seq in list(self.running):
            while seq.state is SequenceState.RUNNING and not self.kv.try_reserve(seq, len(seq.tokens)):
                if self._release_suspended():
                    continue
                if len(self.running) == 1:
                    break  # alone and still short: it finishes at the context limit instead
                self.preempt(self.policy.growth_victim(self))

    # ---- step layout --------------------------------------------------------------------------
    def _lay_out_step(self) -> StepPlan:
        layout = self.policy.lay_out(self)
        plan = StepPlan()
        budget = self.step_token_budget
        # Decoding rows first, so a long prefill never stalls sequences that are generating. Each
        # has one row for sure; tokens forced after its sampled one come out of what is left.
        decoding = [s for s in layout.order if s.is_decoding]
        spare = budget - len(decoding)
        for seq in decoding:
            n = 1 + max(0, min(seq.n_pending - 1, spare))
            plan.chunks.append(Chunk(seq, seq.n_computed, n))
            spare -= n - 1
            budget -= n
            plan.prompt_tokens += max(0, seq.n_prompt - seq.n_computed)  # the prompt's last token
        for seq in layout.order:
            if not seq.is_decoding and budget > 0:
                n = min(seq.n_pending, layout.prefill_room(seq, budget))
                if seq.scores_prompt:
                    n = min(n, self.max_scored_rows)
                if n <= 0:
                    continue
                plan.chunks.append(Chunk(seq, seq.n_computed, n))
                layout.took(seq, n)
                plan.prompt_tokens += n
                budget -= n
        return plan
