"""What the engine measures of itself: its counters as one immutable snapshot (safe to read from
any thread), the board it is published on, and where its step time goes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple

from engine.ownership import SingleWriter

from engine.kv_cache import KvCacheStats


@dataclass(frozen=True)
class TierStats:
    waiting: int
    running: int
    admitted: int  # admissions, resumptions after suspension or preemption included
    suspensions: int  # gave up a slot to an interactive request, kept their KV
    preemptions: int  # gave up their KV cells (recomputed later)
    finished: int
    prompt_tokens: int = 0  # prompt (and recomputed) tokens its sequences fed to llama_decode
    tokens_generated: int = 0  # tokens its sequences produced: sampled, verified drafts, forced


RECENT_STEPS = 64  # step records each snapshot carries: a few seconds of steps at the usual rates


class StepRecord(NamedTuple):
    """What one llama_decode carried, by tier, and how it went (the web page's step chart)."""

    step: int  # its number (EngineStats.steps once it ran)
    ended_at: float  # time.perf_counter() when it ended
    seconds: float  # schedule to outputs applied (an interrupted step: to the abort)
    interactive_rows: int  # decode rows (drafted rows included) of interactive sequences
    batch_rows: int
    interactive_prompt: int  # prompt tokens of interactive sequences
    batch_prompt: int
    interactive_tokens: int  # tokens produced for interactive sequences
    batch_tokens: int
    threads: int
    interrupted: bool  # aborted for an arriving interactive request (or cut by the thread governor)


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
    interactive_token_target_ms: float | None = None  # the per-token target steps are planned for
    latency_bounded_steps: int = 0  # steps whose batch rows the target chose
    batch_rows_granted: int = 0  # batch rows those steps carried
    latency_calibration: float | None = None  # the plan's interval / predicted step seconds (p95)
    lane_first_tokens: int = 0  # requests whose first token the first-token lane gave (counted when handed back)
    speculation: SpeculationStats | None = None  # None: speculative decoding is off
    tenants_waiting: Mapping[str, int] = field(default_factory=dict)  # tenant → queued sequences (fair share on)
    tenant_tokens_produced: Mapping[str, int] = field(default_factory=dict)  # tenant → tokens produced in steps
    recent_steps: tuple[StepRecord, ...] = ()  # the last RECENT_STEPS steps, oldest first


@dataclass(frozen=True)
class SpeculationStats:
    drafted: dict[str, int]  # drafted tokens the model checked, by source (engine/drafts.py)
    accepted: dict[str, int]  # of those, the ones it kept
    steps_with_drafts: int
    verified_rows: int  # output rows of drafted sequences: their sampling rows and drafted tokens not forced


class StatsBoard:
    """The latest EngineStats. The engine thread publishes; any thread reads `latest`, which is
    replaced whole, never edited. Listeners hear each publish on the engine thread."""

    def __init__(self) -> None:
        self.latest: EngineStats | None = None
        self._listeners: list[Callable[[EngineStats], None]] = []

    def listen(self, listener: Callable[[EngineStats], None]) -> None:
        """Call `listener(stats)` on every publish (wire listeners before the engine thread starts)."""
        self._listeners.append(listener)

    def publish(self, stats: EngineStats) -> None:
        self.latest = stats
        for listener in self._listeners:
            listener(stats)


# draft_model: a draft model's decodes (engine/draft_model.py), apart from the scheduling around them.
PHASES = ("schedule", "draft_model", "build_batch", "decode", "sample", "postprocess")


@dataclass
class StepProfile(SingleWriter):
    """Totals over steps of one kind: 'decode' steps (every chunk a generating sequence's new
    tokens: one sampled, and any forced after it) or 'mixed' steps (carrying prompt chunks too).
    Engine thread only; other threads get copies (`Engine.profile`)."""

    steps: int = 0
    tokens: int = 0  # tokens fed to llama_decode
    sampled: int = 0  # tokens produced: sampled, and forced by jump-forward
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def record(self, phase_seconds: tuple[float, ...], tokens: int, sampled: int) -> None:
        self.steps += 1
        self.tokens += tokens
        self.sampled += sampled
        for phase, s in zip(PHASES, phase_seconds):
            self.seconds[phase] += s

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def tokens_per_second(self) -> float:
        return self.sampled / self.total_seconds if self.total_seconds else 0.0

    def per_step_ms(self) -> dict[str, float]:
        return {p: (s * 1000.0 / self.steps if self.steps else 0.0) for p, s in self.seconds.items()}

    def copy(self) -> "StepProfile":
        return StepProfile(self.steps, self.tokens, self.sampled, dict(self.seconds))
