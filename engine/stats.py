"""The engine's counters as one immutable snapshot, safe to read from any thread."""
from __future__ import annotations

from dataclasses import dataclass

from engine.kv_cache import KvCacheStats


@dataclass(frozen=True)
class TierStats:
    waiting: int
    running: int
    admitted: int  # admissions, resumptions after suspension or preemption included
    suspensions: int  # gave up a slot to an interactive request, kept their KV
    preemptions: int  # gave up their KV cells (recomputed later)
    finished: int


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: dict[str, int]
    kv_cells_used: int  # distinct cells the live sequences' tokens occupy (a shared prefix counts once)
    kv_cells_total: int
    kv: KvCacheStats
    tokens_prefilled: int
    tokens_forced: int  # output tokens jump-forward appended unsampled (the grammar allowed nothing else)
    suspensions: int
    preemptions: int
    steps: int  # llama_decode calls, interrupted ones included
    steps_interrupted: int  # batch-only steps aborted for an arriving interactive request
    tiers: dict[str, TierStats]
    decode_threads: int = 0  # threads the next llama_decode will use
    thread_switches: int = 0  # times the thread governor changed that count
