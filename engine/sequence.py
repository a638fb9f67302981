"""A request as the engine runs it: its tokens, what of them is in the KV cache, its output."""
from __future__ import annotations

import enum
import json
import time
from typing import Any, NamedTuple

import numpy as np

from engine.drafts import Draft, NgramIndex
from engine.prompt_words import WordsOfPrompt
from engine.handle import RequestHandle
from engine.ownership import SingleWriter
from engine.request import FinishReason, GenerationResult, Request, RequestMetrics
from engine.text import IncrementalDetokenizer, StopStringFilter
from engine.tuning import DRAFT_CAP_START


class TokenInterval(NamedTuple):
    seconds: float
    back_to_back: bool  # the previous token came from the step just before: none left it out


class SequenceState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"  # prefilling or decoding: it feeds tokens[n_computed:] a chunk at a time
    SUSPENDED = "suspended"  # queued again but keeping its seq id and KV cells: resumes for free
    ELSEWHERE = "elsewhere"  # its first token is computed outside the scheduler (engine/first_token_lane.py)
    FINISHED = "finished"


class Sequence(SingleWriter):
    """Invariant: tokens[:n_computed] are in the KV cache under seq_id, at positions 0..n_computed-1
    (engine/kv_cache.py is the only writer of n_computed).

    Written by one thread at a time, the one holding it: the client thread that made it until it
    is submitted, then the engine thread (or the first-token lane's thread, until the lane hands
    it back through the inbox). Clients follow it through its RequestHandle, never here.

    Prefill and decode are one motion: each step feeds the next chunk of tokens not yet computed;
    when a chunk reaches the end of `tokens`, its last row yields logits and a new token is appended.
    A preempted sequence keeps its tokens and output and simply recomputes from position 0.
    """

    def __init__(
        self,
        request: Request,
        prompt_ids: list[int],
        handle: RequestHandle,
        token_bytes: tuple[bytes, ...],
        rng: np.random.Generator,
        matcher: Any = None,
    ) -> None:
        self.request = request
        self.handle = handle
        self.rng = rng
        self.matcher = matcher  # a grammar matcher when the output must be JSON
        self.tokens: list[int] = list(prompt_ids)
        self.n_prompt = len(prompt_ids)
        self.n_computed = 0
        self.seq_id: int | None = None
        self.state = SequenceState.WAITING
        self.detokenizer = IncrementalDetokenizer(token_bytes)
        self.stop_filter = StopStringFilter(request.stop)
        self.finish_reason: FinishReason | None = None
        self.submitted_at = time.perf_counter()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self._last_token: tuple[float, int | None] | None = None  # (when, engine step)
        self.token_intervals: list[float] = []  # seconds between the steps that gave it tokens
        self.preemptions = 0  # times it gave up its KV cells (and recomputed them)
        self.suspensions = 0  # times it gave up its slot for an interactive request, keeping its KV
        self.forced_tokens = 0  # output tokens appended by jump-forward, unsampled
        self.first_token_from_lane = False  # its first token came from engine/first_token_lane.py
        self.ngrams: NgramIndex | None = None  # its own n-grams, built when it first drafts (engine/drafts.py)
        self.prompt_words: WordsOfPrompt | None = None  # its prompt's words, for structured drafts (engine/prompt_words.py)
        # A proposal that got no rows, judged against the tokens that follow: (the draft, the
        # position its first token would take).
        self.unverified_draft: tuple[Draft, int] | None = None
        self.draft_cap = DRAFT_CAP_START  # its drafts' length at most (engine/speculation.py)
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.arrival_order = 0  # when the scheduler got it, relative to the others (FIFO)
        self.deadline = None if request.timeout is None else self.submitted_at + request.timeout
        self.added_at_step: int | None = None  # engine step count when the scheduler got it
        self.first_token_step: int | None = None
        self.cached_tokens: int | None = None  # prompt tokens served from the prefix cache
        self.logprobs: list[Any] | None = [] if request.logprobs else None
        # Position i holds token i's TokenLogprob once the row before it is computed (engine/prompt_scores.py).
        self.prompt_scores: list[Any] | None = None if request.prompt_logprobs is None else [None] * self.n_prompt

    @property
    def scores_prompt(self) -> bool:
        """Every prompt row must be computed here, with its logits: none may come from the cache."""
        return self.prompt_scores is not None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.n_prompt

    @property
    def n_pending(self) -> int:
        return len(self.tokens) - self.n_computed

    @property
    def is_decoding(self) -> bool:
        """Its pending tokens are its newest output (a sampled token, and any forced after it),
        not a prompt or a recompute."""
        return self.n_pending == 1 or self.n_computed >= self.n_prompt

    @property
    def remaining_tokens(self) -> int:
        """How many more tokens max_tokens allows (the context may allow fewer)."""
        return self.request.max_tokens - self.n_generated

    def token_budget(self, n_ctx: int) -> int:
        """How many more tokens it may get: max_tokens' allowance, capped by the context (whose
        last position still yields one token). A grammar must close its document within this."""
        return min(self.remaining_tokens, n_ctx + 1 - len(self.tokens))

    @property
    def last_token_at(self) -> float | None:
        """When an engine step last gave it tokens (None before its first)."""
        return None if self._last_token is None else self._last_token[0]

    def token_delivered(self, now: float, step: int) -> TokenInterval | None:
        """Note an engine step that gave it tokens: None for its first (that wait is its TTFT), else
        the interval since the previous such step."""
        previous, self._last_token = self._last_token, (now, step)
        if previous is None:
            self.first_token_at, self.first_token_step = now, step
            return None
        seconds = now - previous[0]
        self.token_intervals.append(seconds)
        return TokenInterval(seconds, back_to_back=previous[1] is not None and step == previous[1] + 1)

    def lane_gave_first_token(self, now: float) -> None:
        """Its first token came from engine/first_token_lane.py, outside the engine's steps (the
        engine numbers that step when it adopts the sequence)."""
        self._last_token = (now, None)
        self.first_token_at = now
        self.first_token_from_lane = True

    def structured_data(self) -> Any:
        if self.matcher is None or not self.matcher.is_complete or not self.matcher.json_document:
            return None
        return json.loads(self.stop_filter.text)

    def result(self, error: str | None = None) -> GenerationResult:
        now = time.perf_counter()
        admitted = self.admitted_at if self.admitted_at is not None else now
        generation_s = now - admitted
        ms = lambda seconds: round(seconds * 1000.0, 3)  # noqa: E731
        metrics = RequestMetrics(
            prompt_tokens=self.n_prompt,
            tokens_generated=self.n_generated,
            queue_time_ms=ms(admitted - self.submitted_at),
            ttft_ms=None if self.first_token_at is None else ms(self.first_token_at - self.submitted_at),
            generation_time_ms=ms(generation_s),
            latency_ms=ms(now - self.submitted_at),
            tokens_per_second=round(self.n_generated / generation_s, 3) if generation_s > 0 else 0.0,
            cached_tokens=self.cached_tokens or 0,
            ttft_steps=None if self.first_token_step is None or self.added_at_step is None
            else self.first_token_step - self.added_at_step,
            preemptions=self.preemptions,
            suspensions=self.suspensions,
            forced_tokens=self.forced_tokens,
            inter_token_ms=tuple(ms(s) for s in self.token_intervals),
            first_token_from_lane=self.first_token_from_lane,
            drafted_tokens=self.drafted_tokens,
            accepted_tokens=self.accepted_tokens,
        )
        assert self.finish_reason is not None
        return GenerationResult(
            request_id=self.request_id,
            text=self.stop_filter.text,
            token_ids=tuple(self.tokens[self.n_prompt :]),
            finish_reason=self.finish_reason,
            metrics=metrics,
            error=error,
            structured_data=self.structured_data(),
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
            prompt_token_ids=None if self.prompt_scores is None else tuple(self.tokens[: self.n_prompt]),
            prompt_logprobs=None if self.prompt_scores is None else tuple(self.prompt_scores),
            stop_string=self.stop_filter.matched,
        )
