"""The engine: one thread running schedule → build batch → decode → sample and postprocess."""
from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence as Seq

import numpy as np

from bindings import DecodeOutcome, Model
from engine.config import EngineConfig
from engine.handle import RequestHandle
from engine.kv_cache import KvCache, KvCacheStats
from engine.logprobs import snapshot_rows, token_logprob
from engine.model_source import resolve_model
from engine.profile import StepProfile
from engine.request import (
    EngineClosedError,
    FinishReason,
    GenerationResult,
    PromptTooLongError,
    Priority,
    Request,
    RequestError,
)
from engine.runner import ModelRunner
from engine.scheduler import Chunk, Scheduler, StepPlan
from engine.sequence import Sequence
from sampling.grammar import SchemaError, compile_grammar
from sampling.params import InvalidParameterError, SamplingParams
from sampling.sampler import BatchSampler, NoAllowedTokenError, RowContext
from sampling.vocabulary import TokenVocabulary

_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)
_IDLE_WAIT_S = 0.05


class QueueFullError(RequestError):
    pass


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: dict[str, int]
    kv_cells_used: int  # cells the running sequences hold (shared prefix cells counted per user)
    kv_cells_total: int
    kv: KvCacheStats
    tokens_prefilled: int
    preemptions: int
    steps: int  # llama_decode calls, interrupted ones included
    steps_interrupted: int  # batch-only steps aborted for an arriving interactive request
    tiers: dict[str, "TierStats"]


@dataclass(frozen=True)
class TierStats:
    waiting: int
    running: int
    admitted: int  # admissions, re-admissions after preemption included
    preemptions: int
    finished: int


class Engine:
    """Serves one GGUF model to many concurrent requests with continuous batching.

    Use `submit()` for a handle (stream, await, cancel) or `generate()` to block for results.
    """

    supports_structured_output = True  # format="json" / json_schema are enforced by grammar masks

    def __init__(
        self,
        model_path: str | Path | None = None,
        config: EngineConfig | None = None,
        **config_overrides: Any,
    ) -> None:
        base = config or EngineConfig()
        config = EngineConfig(**{**base.__dict__, **config_overrides}) if config_overrides else base
        model = Model(resolve_model(model_path))
        try:
            runner = ModelRunner(model, config)
        except BaseException:
            model.close()
            raise
        self._start(model, runner, config)

    @classmethod
    def from_backend(cls, model: Any, runner: Any, config: EngineConfig) -> "Engine":
        """An engine over a given model and runner (tests drive the loop with a fake backend)."""
        engine = cls.__new__(cls)
        engine._start(model, runner, config)
        return engine

    def _start(self, model: Any, runner: Any, config: EngineConfig) -> None:
        self.config = cfg = config
        self.model = model
        self._runner = runner
        self.vocabulary = TokenVocabulary(
            self.model.token_bytes, self.model.eog_tokens, self.model.special_tokens
        )
        self.n_ctx = self._runner.n_cells
        holders = cfg.cache_holders if cfg.prefix_cache else 0
        self.kv_cache = KvCache(
            self._runner.context, self.n_ctx, cfg.block_size, running_ids=range(cfg.sequence_ids),
            holder_ids=range(cfg.sequence_ids, cfg.sequence_ids + holders), prefix_cache=cfg.prefix_cache,
            max_cached_blocks=int(cfg.cache_max_fraction * (self.n_ctx // cfg.block_size)),
        )
        self._scheduler = Scheduler(self.kv_cache, cfg.max_batch, cfg.step_token_budget, cfg.priority_policy())
        self._kv_stats = self.kv_cache.stats()  # refreshed by the engine thread, read by anyone
        self._sampler = BatchSampler(self.model.n_vocab)
        self._profiles = {"decode": StepProfile(), "mixed": StepProfile()}
        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._wakeup = threading.Event()
        self._live: dict[str, Sequence] = {}
        self._with_deadline: set[Sequence] = set()
        self._accepting = True
        self._stopping = False
        self._lock = threading.Lock()
        self._steps_run = 0  # llama_decode calls, interrupted ones included
        self._steps_interrupted = 0
        self._finished = {p: 0 for p in Priority}
        self._interrupt_lock = threading.Lock()
        self._interruptible = False  # the step in flight may be aborted for an interactive arrival
        self._step_started = 0.0
        self._clock: Callable[[], float] = time.perf_counter  # step timing for the interrupt window
        self._decode_step_estimate: float | None = None  # seconds, moving average of decode steps
        self._thread = threading.Thread(target=self._run, name="cobatch-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_default(cls, **config_overrides: Any) -> "Engine":
        """The embedded Gemma 3 270M model."""
        return cls(None, **config_overrides)

    # ---- client API -------------------------------------------------------------------------
    def submit(self, request: Request | str | Seq[int], **options: Any) -> RequestHandle:
        """Queue a request. Raises InvalidParameterError, PromptTooLongError, QueueFullError or
        EngineClosedError without changing anything else."""
        return self.submit_many([request], **options)[0]

    def submit_many(self, requests: Seq[Request | str | Seq[int]], **options: Any) -> list[RequestHandle]:
        """Queue several requests at once: all are accepted, or none is (same errors as submit).
        They reach the scheduler together, so they are admitted in the same step when they fit."""
        sequences = [self._new_sequence(self._as_request(r, dict(options))) for r in requests]
        with self._lock:
            if not self._accepting:
                raise EngineClosedError("the engine is shutting down")
            ids = [s.request_id for s in sequences]
            if len(set(ids)) < len(ids) or any(i in self._live for i in ids):
                raise InvalidParameterError("request ids must be unique among live requests")
            queued = self._queued()
            for tier in Priority:
                adding = sum(1 for s in sequences if s.request.priority is tier)
                bound = self._queue_bound(tier)
                if adding and queued[tier] + adding > bound:
                    raise QueueFullError(f"the {tier.value} queue is full: {bound} requests are already waiting")
            for seq in sequences:
                self._live[seq.request_id] = seq
            self._inbox.append(("submit", sequences))
        if any(s.request.priority is Priority.INTERACTIVE for s in sequences):
            self._interrupt_step_in_flight()
        self._wakeup.set()
        return [s.handle for s in sequences]

    def generate(self, prompts: str | Seq[str] | Seq[Seq[int]], **options: Any) -> list[GenerationResult]:
        """Run many prompts concurrently and block until all have finished."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        handles = self.submit_many(prompts, **options)
        return [h.result() for h in handles]

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.model.tokenize(text, add_bos=add_bos)

    def inspect(self, fn: Callable[[ModelRunner], Any], timeout: float = 30.0) -> Any:
        """Run fn(runner) on the engine thread between two steps (llama.cpp is not thread-safe)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.append(("call", (fn, future)))
        self._wakeup.set()
        return future.result(timeout)

    def kv_cells_in_use(self) -> int:
        """Distinct KV cells held right now, measured through llama.cpp's seq_pos_min/max."""
        return self.inspect(lambda runner: self.kv_cache.cells_in_use(runner.context))

    def stats(self) -> EngineStats:
        scheduler = self._scheduler
        running = list(scheduler.running)
        tiers = {
            p.value: TierStats(
                waiting=len(scheduler.waiting[p]),
                running=sum(1 for s in running if s.request.priority is p),
                admitted=scheduler.tiers[p].admitted,
                preemptions=scheduler.tiers[p].preemptions,
                finished=self._finished[p],
            )
            for p in Priority
        }
        return EngineStats(
            running=len(running),
            waiting={p.value: len(q) for p, q in scheduler.waiting.items()},
            kv_cells_used=sum(s.n_computed for s in running),
            kv_cells_total=self.n_ctx,
            kv=self._kv_stats,
            tokens_prefilled=self._scheduler.tokens_prefilled,
            preemptions=self._scheduler.preemptions,
            steps=self._steps_run,
            steps_interrupted=self._steps_interrupted,
            tiers=tiers,
        )

    def profile(self, reset: bool = False) -> dict[str, StepProfile]:
        """Step timings so far, split into pure decode steps and steps carrying prompt chunks."""
        snap = {kind: p.copy() for kind, p in self._profiles.items()}
        if reset:
            self._profiles = {kind: StepProfile() for kind in self._profiles}
        return snap

    def close(self, drain_timeout: float = 0.0) -> None:
        """Stop accepting requests, let running ones finish for up to drain_timeout seconds,
        cancel the rest, then free the context and the model (in that order)."""
        with self._lock:
            self._accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._live and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping = True
        self._wakeup.set()
        self._thread.join()
        self._runner.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            self._drain_inbox()
            self._expire_deadlines()
            if not self._scheduler.has_work():
                self._wakeup.wait(_IDLE_WAIT_S)
                continue
            try:
                if not self._step():  # waiting requests none of which can start yet
                    self._wakeup.wait(_IDLE_WAIT_S)
            except Exception as exc:  # a bug must fail requests, not kill the engine thread
                self._fail_running(exc)
                self._kv_stats = self.kv_cache.stats()
        self._drain_inbox()
        for seq in list(self._live.values()):
            self._finish(seq, FinishReason.CANCELLED, error="the engine shut down")

    def _step(self) -> bool:
        """One engine step; False when there was nothing to decode."""
        clock = time.perf_counter
        t0 = clock()
        plan = self._scheduler.schedule()
        t1 = clock()
        if not plan.chunks:
            return False
        self._runner.build_batch(plan)
        t2 = clock()
        outcome = self._decode(plan)
        t3 = clock()
        if outcome is not DecodeOutcome.OK:
            self._recover(outcome)
            self._kv_stats = self.kv_cache.stats()
            return True
        for chunk in plan.chunks:
            chunk.seq.n_computed += chunk.length
        sampled = [c for c in plan.chunks if c.wants_logits]
        tokens = self._sample(sampled)
        t4 = clock()
        self._postprocess(sampled, tokens)
        self._kv_stats = self.kv_cache.stats()
        t5 = clock()
        kind = "decode" if plan.n_tokens == len(sampled) else "mixed"
        self._profiles[kind].record((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), plan.n_tokens, len(sampled))
        return True

    def _decode(self, plan: StepPlan) -> DecodeOutcome:
        interrupter = self._runner.interrupter
        with self._interrupt_lock:
            interrupter.reset()
            self._interruptible = plan.interruptible
            self._step_started = self._clock()
        try:
            outcome = self._runner.decode()
        finally:
            with self._interrupt_lock:
                self._interruptible = False
                interrupter.reset()
        if plan.interruptible and outcome is DecodeOutcome.OK:
            took = self._clock() - self._step_started
            estimate = self._decode_step_estimate
            self._decode_step_estimate = took if estimate is None else 0.8 * estimate + 0.2 * took
        self._steps_run += 1
        return outcome

    def _interrupt_step_in_flight(self) -> None:
        # Aborting costs the batch rows the part of the step already computed: do it only early
        # in the step, and only when the interactive request would be admitted right after.
        with self._interrupt_lock:
            estimate = self._decode_step_estimate
            young = estimate is None or (
                self._clock() - self._step_started <= self.config.interrupt_window * estimate
            )
            if self._interruptible and young and self._scheduler.interactive_can_start():
                self._runner.interrupter.interrupt()
                self._interruptible = False

    def _sample(self, sampled: list[Chunk]) -> list[int]:
        if not sampled:
            return []
        logits = self._runner.output_logits()
        wanting = [i for i, c in enumerate(sampled) if c.seq.logprobs is not None]
        raw = snapshot_rows(logits, wanting)  # the sampler may edit rows in place
        rows = [self._row_context(c.seq) for c in sampled]
        try:
            tokens = self._sampler.sample_rows(logits, rows).tolist()
        except NoAllowedTokenError as exc:  # fail only the rows whose grammar hit a dead end
            tokens = exc.tokens.tolist()
            for i in exc.rows:
                self._finish(sampled[i].seq, FinishReason.ERROR, error=str(exc))
        for i in wanting:
            seq = sampled[i].seq
            if tokens[i] >= 0:
                seq.logprobs.append(token_logprob(raw[i], tokens[i], seq.request.logprobs))
        return tokens

    def _row_context(self, seq: Sequence) -> RowContext:
        params = seq.request.sampling
        return RowContext(
            params=params,
            rng=seq.rng,
            generated=seq.tokens[seq.n_prompt :] if params.has_penalties else (),
            matcher=seq.matcher,
            remaining_tokens=min(seq.remaining_tokens, self.n_ctx + 1 - len(seq.tokens)),
        )

    def _postprocess(self, sampled: list[Chunk], tokens: list[int]) -> None:
        now = time.perf_counter()
        for chunk, token in zip(sampled, tokens):
            seq = chunk.seq
            if seq.finish_reason is not None:  # failed while sampling
                continue
            try:
                reason = self._append_token(seq, token, now)
            except Exception as exc:
                self._finish(seq, FinishReason.ERROR, error=f"{type(exc).__name__}: {exc}")
                continue
            if reason is not None:
                self._finish(seq, reason)

    def _append_token(self, seq: Sequence, token: int, now: float) -> FinishReason | None:
        seq.tokens.append(token)
        if seq.first_token_at is None:
            seq.first_token_at = now
            seq.first_token_step = self._steps_run
        if seq.matcher is not None:
            seq.matcher.advance(token)
        if token in self.model.eog_tokens and (seq.matcher is not None or not seq.request.ignore_eos):
            return FinishReason.STOP
        seq.handle.publish_delta(seq.stop_filter.feed(seq.detokenizer.push(token)))
        if seq.stop_filter.stopped or (seq.matcher is not None and seq.matcher.is_finished):
            return FinishReason.STOP
        if seq.n_generated >= seq.request.max_tokens:
            return FinishReason.LENGTH
        if len(seq.tokens) > self.n_ctx:  # the next token would need a position past the context
            return FinishReason.CONTEXT_LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        if not seq.stop_filter.stopped:
            seq.handle.publish_delta(seq.stop_filter.feed(seq.detokenizer.flush()))
            seq.handle.publish_delta(seq.stop_filter.flush())
        seq.finish_reason = reason
        self._scheduler.finish(seq)
        self._live.pop(seq.request_id, None)
        self._with_deadline.discard(seq)
        self._finished[seq.request.priority] += 1
        seq.handle.publish_result(seq.result(error))

    def _recover(self, outcome: DecodeOutcome) -> None:
        # llama.cpp rolls back a failed batch, so only the choice of who runs next changes.
        if outcome is DecodeOutcome.ABORTED:
            self._steps_interrupted += 1
            self._scheduler.step_aborted()
        elif outcome is DecodeOutcome.KV_FULL:
            running = self._scheduler.running
            if len(running) > 1:
                self._scheduler.preempt(running[-1])
            elif running:
                self._finish(running[0], FinishReason.ERROR, error="the KV cache has no room for it")

    def _fail_running(self, exc: Exception) -> None:
        message = f"engine step failed: {type(exc).__name__}: {exc}"
        for seq in list(self._scheduler.running):
            self._finish(seq, FinishReason.ERROR, error=message)

    def _drain_inbox(self) -> None:
        if not self._inbox:
            return
        while self._inbox:
            kind, payload = self._inbox.popleft()
            if kind == "submit":
                for seq in payload:
                    if seq.finish_reason is None:  # it may have been cancelled while in the inbox
                        seq.arrival_step = self._steps_run
                        self._scheduler.add(seq)
                        if seq.deadline is not None:
                            self._with_deadline.add(seq)
            elif kind == "cancel":
                seq = self._live.get(payload)
                if seq is not None:
                    self._finish(seq, FinishReason.CANCELLED)
            elif kind == "call":
                fn, future = payload
                try:
                    future.set_result(fn(self._runner))
                except Exception as exc:
                    future.set_exception(exc)
        self._kv_stats = self.kv_cache.stats()

    def _expire_deadlines(self) -> None:
        if not self._with_deadline:
            return
        now = time.perf_counter()
        expired = [s for s in self._with_deadline if s.deadline <= now]
        for seq in expired:
            self._finish(seq, FinishReason.TIMEOUT, error=f"its timeout of {seq.request.timeout:g} s passed")
        if expired:
            self._kv_stats = self.kv_cache.stats()

    # ---- helpers ----------------------------------------------------------------------------
    def _request_cancel(self, request_id: str) -> None:
        self._inbox.append(("cancel", request_id))
        self._wakeup.set()

    def _queued(self) -> dict[Priority, int]:
        queued = {p: len(self._scheduler.waiting[p]) for p in Priority}
        for kind, payload in list(self._inbox):
            if kind == "submit":
                for seq in payload:
                    queued[seq.request.priority] += 1
        return queued

    def _queue_bound(self, tier: Priority) -> int:
        if tier is Priority.INTERACTIVE:
            return self.config.max_waiting_interactive
        return self.config.max_waiting

    def _new_sequence(self, request: Request) -> Sequence:
        prompt_ids = self._prompt_ids(request)
        bad_bias = [t for t, _ in request.sampling.logit_bias if t >= self.model.n_vocab]
        if bad_bias:
            raise InvalidParameterError(
                f"logit_bias token id {bad_bias[0]} is outside the vocabulary (size {self.model.n_vocab})"
            )
        matcher = self._grammar_matcher(request) if request.format == "json" else None
        handle = RequestHandle(request.request_id, len(prompt_ids), self._request_cancel)
        rng = np.random.default_rng(request.sampling.seed)
        return Sequence(request, prompt_ids, handle, self.model.token_bytes, rng, matcher)

    def _grammar_matcher(self, request: Request) -> Any:
        schema = None if request.json_schema is None else dict(request.json_schema)
        try:
            matcher = compile_grammar(schema, self.vocabulary).matcher()
        except SchemaError as exc:
            raise InvalidParameterError(f"json_schema: {exc}") from exc
        needed = matcher.min_tokens_to_complete()
        if request.max_tokens < needed:
            raise InvalidParameterError(
                f"max_tokens={request.max_tokens} is too small for this schema: its shortest "
                f"document needs {needed} tokens"
            )
        return matcher

    def _as_request(self, request: Request | str | Seq[int], options: dict[str, Any]) -> Request:
        if isinstance(request, Request):
            if options:
                raise InvalidParameterError("pass options inside the Request, not beside it")
            return request
        unknown = set(options) - _SAMPLING_FIELDS - set(Request.__dataclass_fields__)
        if unknown:
            raise InvalidParameterError(f"unknown option(s): {', '.join(sorted(unknown))}")
        sampling = SamplingParams(**{k: options.pop(k) for k in list(options) if k in _SAMPLING_FIELDS})
        return Request(prompt=request, sampling=sampling, **options)

    def _prompt_ids(self, request: Request) -> list[int]:
        if isinstance(request.prompt, str):
            ids = self.model.tokenize(request.prompt, add_bos=request.add_bos)
        else:
            ids = list(request.prompt)
            bad = [t for t in ids if t >= self.model.n_vocab]
            if bad:
                raise InvalidParameterError(
                    f"token id {bad[0]} is outside the vocabulary (size {self.model.n_vocab})"
                )
        if not ids:
            raise InvalidParameterError("the prompt tokenizes to nothing")
        if len(ids) >= self.n_ctx:
            raise PromptTooLongError(
                f"prompt has {len(ids)} tokens but the context holds {self.n_ctx}; "
                f"shorten it to at most {self.n_ctx - 1} tokens"
            )
        return ids
