"""Decides, before each step, which sequences feed which tokens.

Running sequences come first (decoding rows cost one token each), then prompt chunks under the
step's token budget, then admissions. KV cells are counted so llama_decode never has to find
out the cache is full: a sequence is admitted only when its whole pending prompt fits, and when
growth runs out of cells the most recently admitted sequence is preempted and recomputed later.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable

from engine.request import Priority
from engine.sequence import Sequence, SequenceState


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
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(c.length for c in self.chunks)


class Scheduler:
    def __init__(
        self,
        n_cells: int,
        max_running: int,
        step_token_budget: int,
        free_kv: Callable[[int], None],
    ) -> None:
        self.n_cells = n_cells
        self.max_running = max_running
        self.step_token_budget = step_token_budget
        self._free_kv = free_kv
        self._free_ids = list(range(max_running - 1, -1, -1))
        self.waiting: dict[Priority, collections.deque[Sequence]] = {
            p: collections.deque() for p in Priority
        }
        self.running: list[Sequence] = []  # in admission order
        self.preemptions = 0

    @property
    def n_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    @property
    def cells_in_use(self) -> int:
        return sum(s.n_computed for s in self.running)

    def add(self, seq: Sequence) -> None:
        seq.state = SequenceState.WAITING
        self.waiting[seq.request.priority].append(seq)

    def has_work(self) -> bool:
        return bool(self.running) or self.n_waiting > 0

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self._make_room_for_growth(plan)
        budget = self.step_token_budget
        # Decoding rows first, so a long prefill never stalls sequences that are generating.
        for seq in self.running:
            if seq.n_pending == 1:
                plan.chunks.append(Chunk(seq, seq.n_computed, 1))
                budget -= 1
        for seq in self.running:
            if seq.n_pending > 1 and budget > 0:
                n = min(seq.n_pending, budget)
                plan.chunks.append(Chunk(seq, seq.n_computed, n))
                budget -= n
        while budget > 0 and (seq := self._admit_next()) is not None:
            n = min(seq.n_pending, budget)
            plan.chunks.append(Chunk(seq, 0, n))
            budget -= n
        return plan

    def finish(self, seq: Sequence) -> None:
        """Take a finished or cancelled sequence out, freeing its KV before its id can be reused."""
        if seq.state is SequenceState.RUNNING:
            self.running.remove(seq)
            self._release_id(seq)
        elif seq.state is SequenceState.WAITING:
            self.waiting[seq.request.priority].remove(seq)
        seq.state = SequenceState.FINISHED

    def preempt(self, seq: Sequence) -> None:
        """Put a running sequence back at the head of its queue; it keeps its tokens and output."""
        self.running.remove(seq)
        self._release_id(seq)
        seq.n_computed = 0
        seq.preemptions += 1
        self.preemptions += 1
        seq.state = SequenceState.WAITING
        self.waiting[seq.request.priority].appendleft(seq)

    def _cells_committed(self) -> int:
        # Every running sequence will hold all of its tokens once its prefill completes.
        return sum(len(s.tokens) for s in self.running)

    def _make_room_for_growth(self, plan: StepPlan) -> None:
        while len(self.running) > 1 and self._cells_committed() > self.n_cells:
            victim = self.running[-1]
            self.preempt(victim)
            plan.preempted.append(victim)

    def _admit_next(self) -> Sequence | None:
        if not self._free_ids or len(self.running) >= self.max_running:
            return None
        for priority in (Priority.INTERACTIVE, Priority.BATCH):
            queue = self.waiting[priority]
            if queue:
                seq = queue[0]
                # Room for its whole prompt plus one new token for every running sequence.
                needed = len(seq.tokens) + len(self.running) + 1
                if self._cells_committed() + needed > self.n_cells and self.running:
                    return None
                queue.popleft()
                seq.seq_id = self._free_ids.pop()
                seq.state = SequenceState.RUNNING
                if seq.admitted_at is None:
                    seq.admitted_at = time.perf_counter()
                self.running.append(seq)
                return seq
        return None

    def _release_id(self, seq: Sequence) -> None:
        assert seq.seq_id is not None
        self._free_kv(seq.seq_id)
        self._free_ids.append(seq.seq_id)
        seq.seq_id = None
