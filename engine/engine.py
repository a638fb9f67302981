"""The engine as Python callers and the server use it: intake, the engine thread, the core."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence as Seq

from bindings import Model
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.draft_model import DraftModel, load_draft_model
from engine.first_token_lane import FirstTokenLane
from engine.handle import LoopWaker, RequestHandle
from engine.inbox import Inbox
from engine.intake import Intake
from engine.interrupt_window import InterruptWindow
from engine.loop import EngineLoop
from engine.model_source import resolve_model
from engine.request import GenerationResult, Priority, Request
from engine.runner import ModelRunner
from engine.sequence import Sequence
from engine.stats import EngineStats, StatsBoard, StepProfile

LaneFactory = Callable[[Inbox, threading.Event, LoopWaker], "FirstTokenLane | None"]


class Engine:
    """Serves one GGUF model to many concurrent requests with continuous batching.

    Use `submit()` for a handle (stream, await, cancel) or `generate()` to block for results.
    Its methods may be called from any thread: they read published snapshots and send commands
    to the engine thread through the inbox (docs/architecture.md, "Who may write what").
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        config: EngineConfig | None = None,
        **config_overrides: Any,
    ) -> None:
        base = config or EngineConfig()
        config = EngineConfig(**{**base.__dict__, **config_overrides}) if config_overrides else base
        model = Model(resolve_model(model_path))
        runner = draft = None
        try:
            runner = ModelRunner(model, config)
            if config.draft_model is not None:
                draft = load_draft_model(config.draft_model, model, runner.n_ctx, config.sequence_ids,
                                         config.n_threads, config.flash_attn)
        except BaseException:
            if runner is not None:
                runner.close()
            model.close()
            raise

        def lane(inbox: Inbox, wakeup: threading.Event, waker: LoopWaker) -> FirstTokenLane | None:
            if not (config.first_token_lane_tokens and config.priority_scheduling):
                return None
            return FirstTokenLane(model, config.first_token_lane_tokens, runner.n_ctx, swa_full=config.prefix_cache,
                                  flash_attn=config.flash_attn, hand_over=inbox.hand_over, wake_engine=wakeup.set,
                                  published=waker.flush)

        self._start(model, runner, config, time.perf_counter, lane, draft)

    @classmethod
    def from_backend(cls, model: Any, runner: Any, config: EngineConfig, clock: Callable[[], float] = time.perf_counter) -> "Engine":
        """An engine over a given model and runner (tests drive the loop with a fake backend)."""
        engine = cls.__new__(cls)
        engine._start(model, runner, config, clock, lambda inbox, wakeup, waker: None)
        return engine

    @classmethod
    def from_default(cls, **config_overrides: Any) -> "Engine":
        """The embedded Gemma 3 270M model."""
        return cls(None, **config_overrides)

    def _start(self, model: Any, runner: Any, config: EngineConfig, clock: Callable[[], float],
               make_lane: LaneFactory, draft_model: DraftModel | None = None) -> None:
        # Built in dependency order: each part gets, at construction, everything it talks to.
        self.config = config
        self.model = model
        self.draft_model = draft_model
        self.n_ctx: int = runner.n_ctx
        self._board = StatsBoard()
        self._waker = LoopWaker()  # wakes the clients' event loops, once per engine turn
        wakeup = threading.Event()  # wakes the engine thread
        bounds = {Priority.BATCH: config.max_waiting, Priority.INTERACTIVE: config.max_waiting_interactive}
        self._inbox = Inbox(bounds, self._board)
        self._intake = Intake(model, self.n_ctx, self._cancel, self._waker)
        self.vocabulary = self._intake.vocabulary
        self.interrupt_window = InterruptWindow(runner.interrupter, config.interrupt_window, clock)
        self._lane = make_lane(self._inbox, wakeup, self._waker)
        self.core = EngineCore(model, runner, config, board=self._board, watch=self.interrupt_window,
                               on_finished=self._inbox.finished,
                               lane_busy=(lambda: False) if self._lane is None else self._lane.is_busy,
                               draft_model=draft_model)
        self._loop = EngineLoop(self.core, self._inbox, wakeup, self._waker, nice=config.engine_nice)

    # ---- client API -------------------------------------------------------------------------
    def submit(self, request: Request | str | Seq[int], **options: Any) -> RequestHandle:
        """Queue a request: a Request, or a prompt with Request and SamplingParams fields as
        keyword options (their defaults apply: greedy, max_tokens 512). Raises a RequestError
        (InvalidParameterError, PromptTooLongError, QueueFullError, EngineClosedError) without
        changing anything else."""
        return self.submit_many([request], **options)[0]

    def submit_many(self, requests: Seq[Request | str | Seq[int]], **options: Any) -> list[RequestHandle]:
        """Queue several requests at once: all are accepted, or none is (same errors as submit).
        They reach the scheduler together, so they are admitted in the same step when they fit."""
        sequences = [self._intake.sequence(r, options) for r in requests]
        to_lane = self._claim_lane(sequences)
        try:
            self._inbox.submit(sequences, to_lane=to_lane)
        except BaseException:
            if to_lane is not None:
                self._lane.unclaim()  # type: ignore[union-attr]
            raise
        if to_lane is not None:
            self._lane.start(to_lane)  # type: ignore[union-attr]
            self.interrupt_window.lane_started()
        elif any(s.request.priority is Priority.INTERACTIVE for s in sequences):
            self.interrupt_window.arrival()
        self._loop.wake()
        return [s.handle for s in sequences]

    def generate(self, prompts: str | Seq[str] | Seq[Seq[int]], **options: Any) -> list[GenerationResult]:
        """Run many prompts concurrently and block until all have finished."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        handles = self.submit_many(prompts, **options)
        return [h.result() for h in handles]

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.model.tokenize(text, add_bos=add_bos)

    def inspect(self, fn: Callable[[Any], Any], timeout: float = 30.0) -> Any:
        """Run fn(runner) on the engine thread between two steps (llama.cpp is not thread-safe)."""
        future = self._inbox.call(lambda: fn(self.core.runner))
        self._loop.wake()
        return future.result(timeout)

    def kv_cells_in_use(self) -> int:
        """Distinct KV cells held right now, measured through llama.cpp's seq_pos_min/max."""
        return self.inspect(lambda runner: self.core.kv_cache.cells_in_use(runner.context))

    def stats(self) -> EngineStats:
        """The engine's counters as of its last publish (each step, and each turn of its loop)."""
        stats = self._board.latest
        assert stats is not None  # the core publishes when it is built
        return stats

    def is_idle(self) -> bool:
        """Nothing queued, running or in transit."""
        return self._inbox.is_idle()

    def profile(self, reset: bool = False, timeout: float = 30.0) -> dict[str, StepProfile]:
        """Step timings so far, split into pure decode steps and steps carrying prompt chunks
        (copies, taken on the engine thread between two steps; `reset` starts them afresh)."""
        future = self._inbox.call(lambda: self.core.take_profiles(reset))
        self._loop.wake()
        return future.result(timeout)

    def drain(self, timeout: float) -> None:
        """Accept nothing new; let live requests finish for up to `timeout` seconds, then cancel
        the rest and wait for them to answer."""
        self._loop.drain(timeout)

    def close(self, drain_timeout: float = 0.0) -> None:
        """Drain, then stop the engine thread and free the contexts and the models (in that order)."""
        self._loop.drain(drain_timeout)
        if self._lane is not None:
            self._lane.close()  # what it holds is handed over, and answered by the loop's stop
        self._loop.stop()
        if self.draft_model is not None:
            self.draft_model.close()
        self.core.runner.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _claim_lane(self, sequences: list[Sequence]) -> Sequence | None:
        """The one request the first-token lane takes, if any: a lone interactive request it can
        serve, arriving while the engine is busy (an idle engine's own threads are faster)."""
        lane = self._lane
        if lane is None or len(sequences) != 1 or not lane.accepts(sequences[0]) or self._inbox.is_idle():
            return None
        return sequences[0] if lane.claim() else None

    def _cancel(self, request_id: str) -> None:
        self._inbox.cancel(request_id)
        self._loop.wake()
