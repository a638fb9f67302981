"""Every engine setting in one place, checked once."""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine.policy import FifoPolicy, SchedulingPolicy, TwoTierPolicy


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings. With the prefix cache on, Gemma 3's sliding-window layers keep their full
    cache (llama.cpp's swa_full): a reused prefix needs every one of its cells, not just the last
    window's, and a finished sequence's early cells would otherwise be gone."""

    n_ctx: int = 8192  # KV cells shared by all sequences (one unified cache)
    max_batch: int = 32  # sequences running at once
    step_token_budget: int = 256  # tokens per llama_decode: decode rows first, then prompt chunks
    n_threads: int = max(1, os.cpu_count() or 1)
    # Measure step times and run fewer threads while that is faster (another process on the
    # cores makes ggml's threads wait for each other at every graph node): engine/thread_governor.py.
    adaptive_threads: bool = True
    max_waiting: int = 1024  # queued batch requests before submit() refuses another
    max_waiting_interactive: int = 256  # the same bound for the interactive tier
    block_size: int = 16  # KV cells per ledger block
    prefix_cache: bool = True  # keep finished prompts' full blocks for reuse
    cache_holders: int = 64  # seq ids reserved to hold cached prefixes (max_batch + this <= 256)
    # Share of the KV blocks idle cached prefixes may keep: cached cells are not free, and
    # every decode step's attention spans the used cells of the whole cache.
    cache_max_fraction: float = 0.25
    # With llama.cpp's CPU flash attention, a row's result depends on how many KV cells the
    # whole unified cache holds, so a request's greedy text would change with its neighbours.
    # Off by default: each request's output is then independent of who else is running.
    flash_attn: bool = False
    # Two priority tiers (engine/policy.py explains the policy). Off: one FIFO queue.
    priority_scheduling: bool = True
    batch_min_share: float = 0.25  # of slots, prompt tokens and steps batch work always keeps
    # An interactive arrival aborts a pure decode step in flight if it has run less than this
    # fraction of a typical such step (0: never). Aborting later would waste more batch work
    # than it saves the interactive request: the step's last part is the output projection,
    # which llama.cpp cannot abort, so a late abort only discards a finished step.
    interrupt_window: float = 0.5
    # While interactive sequences decode, each step carries at most this many batch tokens
    # (rows rotate, so every batch sequence progresses): an interactive token waits for one
    # step, whose time grows with its rows. None: no bound.
    interactive_batch_rows: int | None = 3
    # Where a JSON grammar admits one continuation only, append its tokens unsampled and feed
    # them in one chunk (engine/jump_forward.py).
    jump_forward: bool = True

    def __post_init__(self) -> None:
        if self.n_ctx < 64:
            raise ValueError(f"n_ctx must be at least 64, got {self.n_ctx}")
        if not 1 <= self.max_batch <= 255:
            raise ValueError(f"max_batch must be between 1 and 255, got {self.max_batch}")
        if self.step_token_budget < self.max_batch:
            raise ValueError(
                "step_token_budget must be at least max_batch, so every running sequence can "
                f"decode each step (got {self.step_token_budget} < {self.max_batch})"
            )
        if self.n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, got {self.n_threads}")
        if self.block_size < 1 or self.n_ctx % self.block_size:
            raise ValueError(f"block_size must divide n_ctx, got {self.block_size} for {self.n_ctx}")
        if self.cache_holders < 0 or self.max_batch + self.cache_holders > 256:
            raise ValueError("cache_holders must be >= 0 and max_batch + cache_holders <= 256")
        if not 0.0 <= self.interrupt_window <= 1.0:
            raise ValueError(f"interrupt_window must be between 0 and 1, got {self.interrupt_window}")
        if not 0.0 <= self.cache_max_fraction <= 1.0:
            raise ValueError(f"cache_max_fraction must be between 0 and 1, got {self.cache_max_fraction}")
        if self.max_waiting < 1 or self.max_waiting_interactive < 1:
            raise ValueError("max_waiting and max_waiting_interactive must be >= 1")
        self.scheduling_policy()  # checks batch_min_share

    @property
    def sequence_ids(self) -> int:
        """Seq ids for sequences that hold KV cells: the running ones, and up to as many again
        for batch sequences suspended to make room for interactive ones (llama.cpp allows 256
        seq ids in all, the prefix cache's holders included)."""
        holders = self.cache_holders if self.prefix_cache else 0
        return max(self.max_batch, min(2 * self.max_batch, 256 - holders))

    def scheduling_policy(self) -> SchedulingPolicy:
        """A new policy object (it keeps per-engine state)."""
        if not self.priority_scheduling:
            return FifoPolicy()
        return TwoTierPolicy(self.max_batch, self.step_token_budget, self.batch_min_share, self.interrupt_window > 0,
                             self.interactive_batch_rows)
