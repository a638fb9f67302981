"""Decides, before each step, which sequences feed which tokens.

Running sequences come first (decoding rows cost one token each), then prompt chunks under the
step's token budget, then admissions. KV blocks are reserved in the ledger before llama_decode
ever sees a token, so it never has to discover that the cache is full: a sequence is admitted
only when blocks for all its tokens fit (less what the prefix cache already holds), and when
growth runs out of blocks the most recently admitted sequence is preempted (its computed blocks
go to the prefix cache, its output is kept) and recomputed later.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from engine.kv_cache import KvCache
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

    @property
    def n_tokens(self) -> int:
        return sum(c.length for c in self.chunks)


class Scheduler:
    def __init__(self, kv: KvCache, max_running: int, step_token_budget: int) -> None:
        self.kv = kv
        self.max_running = max_running
        self.step_token_budget = step_token_budget
        self.waiting: dict[Priority, collections.deque[Sequence]] = {
            p: collections.deque() for p in Priority
        }
        self.running: list[Sequence] = []  # in admission order
        self.preemptions = 0
        self.tokens_prefilled = 0  # prompt (and recomputed) tokens fed to llama_decode

    @property
    def n_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def add(self, seq: Sequence) -> None:
        seq.state = SequenceState.WAITING
        self.waiting[seq.request.priority].append(seq)

    def has_work(self) -> bool:
        return bool(self.running) or self.n_waiting > 0

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self._make_room_for_growth()
        budget = self.step_token_budget
        # Decoding rows first, so a long prefill never stalls sequences that are generating.
        for seq in self.running:
            if seq.n_pending == 1:
                plan.chunks.append(Chunk(seq, seq.n_computed, 1))
                budget -= 1
                if seq.n_generated == 0:  # the last prompt token, not a sampled one
                    self.tokens_prefilled += 1
        for seq in self.running:
            if seq.n_pending > 1 and budget > 0:
                budget -= self._prefill_chunk(plan, seq, budget)
        while budget > 0 and (seq := self._admit_next()) is not None:
            budget -= self._prefill_chunk(plan, seq, budget)
        return plan

    def _prefill_chunk(self, plan: StepPlan, seq: Sequence, budget: int) -> int:
        n = min(seq.n_pending, budget)
        plan.chunks.append(Chunk(seq, seq.n_computed, n))
        self.tokens_prefilled += n
        return n

    def finish(self, seq: Sequence) -> None:
        """Take a finished or cancelled sequence out, freeing its KV before its id can be reused."""
        if seq.state is SequenceState.RUNNING:
            self.running.remove(seq)
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
        self.preemptions += 1
        seq.state = SequenceState.WAITING
        self.waiting[seq.request.priority].appendleft(seq)

    def _make_room_for_growth(self) -> None:
        # Every running sequence will hold all of its tokens after this step.
        for seq in list(self.running):
            while seq.state is SequenceState.RUNNING and not self.kv.try_reserve(seq, len(seq.tokens)):
                if len(self.running) == 1:
                    break  # alone and still short: it finishes at the context limit instead
                self.preempt(self.running[-1])

    def _admit_next(self) -> Sequence | None:
        if len(self.running) >= self.max_running or not self.kv.has_free_id:
            return None
        for priority in (Priority.INTERACTIVE, Priority.BATCH):
            queue = self.waiting[priority]
            if queue:
                seq = queue[0]
                if not self.kv.try_admit(seq):
                    return None
                queue.popleft()
                seq.state = SequenceState.RUNNING
                if seq.admitted_at is None:
                    seq.admitted_at = time.perf_counter()
                self.running.append(seq)
                return seq
        return None
