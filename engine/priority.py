"""The two-tier priority policy: what interactive requests get, and what batch work keeps.

Measured on the 2-core machine (Gemma 3 270M): a 21-token prompt gets its first token in about
100 ms on an idle engine, while one step of 24 batch decode rows takes about 230 ms. Admission
order alone therefore leaves an interactive request waiting for the step in flight and then for
a long mixed step (450-650 ms measured). So, while an interactive request reads its prompt:

- an arriving interactive request interrupts the step in flight if that is a pure decode step
  and has run less than `interrupt_window` (default half) of a typical one; llama.cpp rolls the
  aborted batch back and it is decoded again. Later in a step an abort would waste more batch
  work than it saves: llama.cpp checks for an abort only between graph nodes, and the last
  node, the output projection over Gemma's 262,144-token vocabulary, is 40-50% of a 32-row
  step (bench/abort_floor.py). An abort raised while it runs takes effect when the step is
  complete and throws all of it away, without giving the interactive request its token sooner;
- the next step carries the interactive prompts alone, so the prefill runs as fast as on an
  idle engine (interactive sequences already decoding wait that one step too).

For a slot, a batch sequence is suspended (it keeps its KV and resumes without recomputing);
only when KV blocks run short is one released and later recomputed. Batch work pays in aborted
partial steps and prompt-only steps; `batch_min_share` bounds the cost: batch keeps that
fraction of running slots and of each step's prompt tokens, and runs in at least one of every
1/batch_min_share steps. Once interactive sequences are decoding, they
share steps with batch rows: capping the batch would cut batch throughput for a per-token time
the interactive client hardly notices at this model size (see bench/mixed_priority.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PriorityPolicy:
    enabled: bool = True  # False: one FIFO queue, no preemption for priority (the bench baseline)
    batch_min_share: float = 0.25
    interrupt_steps: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.batch_min_share < 1.0:
            raise ValueError(f"batch_min_share must be at least 0 and below 1, got {self.batch_min_share}")
