"""A model-free backend for the engine loop: deterministic tokens, KV cells kept in sets, and a
gate that lets a test run the engine one step at a time.

The engine runs its real scheduler, KV ledger, sampler and bookkeeping over it; only
llama_decode is replaced. The "model" always picks token 2 + (sum of the sequence's tokens)
mod 60, so any sequence's output is a function of its own tokens alone, whatever batch it ran
in, and a preempted or interrupted sequence must reproduce it exactly.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from bindings import DecodeOutcome
from engine import Engine, EngineConfig
from engine.core import EngineCore
from engine.intake import Intake

N_VOCAB = 64
EOG = 1


def expected_tokens(prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(2 + sum(tokens) % 60)
    return tokens[len(prompt):]


class FakeModel:
    n_vocab = N_VOCAB
    n_embd, n_params = 8, 0  # no weights: no projection share for the draft rows' price
    weights_repacked = False  # rows cost alike, one at a time
    token_bytes = tuple(b"" if i < 2 else bytes([ord("a") + i % 26]) for i in range(N_VOCAB))
    eog_tokens = frozenset({EOG})
    special_tokens = frozenset({0, EOG})

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return ([0] if add_bos else []) + [2 + b % 60 for b in text.encode()]

    def close(self) -> None:
        pass


class FakeMemory:
    """llama.cpp's memory ops over sets of positions per seq id."""

    def __init__(self) -> None:
        self.cells: dict[int, set[int]] = {}

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        held = self.cells.get(seq_id, set())
        lo, hi = (0 if p0 < 0 else p0), (1 << 30 if p1 < 0 else p1)
        self.cells[seq_id] = {p for p in held if not lo <= p < hi}
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        lo, hi = (0 if p0 < 0 else p0), (1 << 30 if p1 < 0 else p1)
        self.cells.setdefault(dst, set()).update(p for p in self.cells.get(src, ()) if lo <= p < hi)

    def seq_pos_min(self, seq_id: int) -> int:
        return min(self.cells.get(seq_id) or {-1})

    def seq_pos_max(self, seq_id: int) -> int:
        return max(self.cells.get(seq_id) or {-1})

    def n_cells_held(self) -> int:
        return sum(len(c) for c in self.cells.values())


class FakeInterrupter:
    def __init__(self) -> None:
        self.interrupted = False

    def interrupt(self) -> None:
        self.interrupted = True

    def reset(self) -> None:
        self.interrupted = False


@dataclass(frozen=True)
class Row:
    request_id: str
    start: int
    length: int
    drafted: int = 0  # draft rows after the sequence's own tokens


class StepGate:
    """The engine blocks here at each decode until the test lets one step through."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._allowed = 0
        self._blocked = False
        self.free_running = False
        self.engine_idle = lambda: False  # set by fake_engine

    def pass_through(self) -> None:
        with self._cond:
            self._blocked = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.free_running or self._allowed > 0)
            if not self.free_running:
                self._allowed -= 1
            self._blocked = False
            self._cond.notify_all()

    def wait_blocked(self, timeout: float = 10.0) -> None:
        """Until the next step waits at the gate, or the engine has nothing left to do."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (self._blocked and self._allowed == 0):
                if self._allowed == 0 and self.engine_idle():
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError("the engine did not reach its next step")
                self._cond.wait(0.01)

    def step(self, n: int = 1) -> None:
        """Let n steps run; returns with the next step planned and waiting at the gate."""
        for _ in range(n):
            self.wait_blocked()
            with self._cond:
                self._allowed += 1
                self._cond.notify_all()
            self.wait_blocked()

    def release(self) -> None:
        with self._cond:
            self.free_running = True
            self._cond.notify_all()


class FakeRunner:
    def __init__(self, n_ctx: int, gate: StepGate | None = None) -> None:
        self.context = FakeMemory()
        self.interrupter = FakeInterrupter()
        self.n_ctx = n_ctx
        self.gate = gate
        self.current: list[Row] = []  # the step being decoded (or about to be)
        self.decoded: list[list[Row]] = []  # every step that completed
        self.aborted: list[list[Row]] = []
        self.history: list[tuple[bool, list[Row]]] = []  # (completed?, rows) for every decode call
        self._row_sums: list[int] = []

    def build_batch(self, plan) -> list:
        self._chunks = [c for c in plan.chunks if c.n_rows == 1] + [c for c in plan.chunks if c.n_rows > 1]
        self.current = [Row(c.seq.request_id, c.start, c.length, len(c.draft)) for c in self._chunks]
        self.n_outputs = sum(1 + len(c.draft) for c in self._chunks if c.wants_logits)
        # Each output row sees its sequence's tokens and the drafted tokens before it.
        self._row_sums = [sum(c.seq.tokens) + sum(c.draft[:i]) for c in self._chunks if c.wants_logits
                          for i in range(1 + len(c.draft))]
        return [c.seq for c in self._chunks if c.wants_logits for _ in range(1 + len(c.draft))]

    def set_threads(self, n_threads: int) -> None:
        self.threads = n_threads

    def decode(self) -> DecodeOutcome:
        if self.gate is not None:
            self.gate.pass_through()
        if self.interrupter.interrupted:
            self.aborted.append(self.current)
            self.history.append((False, self.current))
            return DecodeOutcome.ABORTED
        for c in self._chunks:
            cells = self.context.cells.setdefault(c.seq.seq_id, set())
            assert not cells.intersection(range(c.start, c.start + c.n_rows)), "position decoded twice"
            cells.update(range(c.start, c.start + c.n_rows))
        self.decoded.append(self.current)
        self.history.append((True, self.current))
        return DecodeOutcome.OK

    def output_logits(self) -> np.ndarray:
        logits = np.zeros((len(self._row_sums), N_VOCAB), dtype=np.float32)
        for i, total in enumerate(self._row_sums):
            logits[i, 2 + total % 60] = 30.0
        return logits

    def record_prompt_scores(self) -> None:
        pass  # fake logits carry no meaning to score

    def import_cells(self, seq_id: int, cells: bytes) -> bool:
        """A prompt computed in another context (fake cells: one byte per position)."""
        self.context.cells.setdefault(seq_id, set()).update(range(len(cells)))
        return True

    def close(self) -> None:
        pass


def fake_engine(gate: StepGate | None = None, **overrides) -> tuple[Engine, FakeRunner]:
    # Speculation off unless a test asks for it: most tests assert the exact rows of each step.
    settings = dict(n_ctx=1024, max_running=4, step_token_budget=64, n_threads=1, prefix_cache=False,
                    block_size=16, speculative=False)
    settings.update(overrides)
    config = EngineConfig(**settings)
    runner = FakeRunner(config.n_ctx, gate)
    # Fake steps take no time unless a test moves this clock: an arrival is always early in one.
    runner.now = [0.0]
    engine = Engine.from_backend(FakeModel(), runner, config, clock=lambda: runner.now[0])
    if gate is not None:
        gate.engine_idle = engine.is_idle
    return engine, runner


def find(engine: Engine, request_id: str):
    """The engine's sequence for a request (the test reads it while the engine waits at the gate)."""
    scheduler = engine.core.scheduler
    for seq in [*scheduler.running, *(s for q in scheduler.waiting.values() for s in q)]:
        if seq.request_id == request_id:
            return seq
    return None


class FakeCore:
    """The engine core over the fake backend, driven one step at a time (no engine thread)."""

    def __init__(self, **overrides) -> None:
        settings = dict(n_ctx=1024, max_running=4, step_token_budget=64, n_threads=1, prefix_cache=False,
                        speculative=False)
        settings.update(overrides)
        config = EngineConfig(**settings)
        self.runner = FakeRunner(config.n_ctx)
        self.finished: list[str] = []
        self.core = EngineCore(FakeModel(), self.runner, config, on_finished=lambda s: self.finished.append(s.request_id))
        self.intake = Intake(FakeModel(), config.n_ctx, canceller=lambda request_id: None)

    def add(self, request_id: str, tokens: list[int], max_tokens: int, priority: str = "batch", **fields):
        seq = self.intake.sequence(tokens, dict(max_tokens=max_tokens, request_id=request_id, priority=priority,
                                               temperature=0.0, **fields))
        self.core.add(seq)
        return seq

    def rows(self) -> set[str]:
        return {r.request_id for r in self.runner.current}

    def run_to_end(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.core.has_work():
                return
            self.core.step()
        raise AssertionError("the core did not finish its work")
