"""A short interactive prompt's first token, computed beside the main context instead of after it.

An interactive request that arrives while the engine decodes would wait for the step in flight,
and the last part of a step (the output projection of its rows) cannot be aborted. The lane
owns a small context of its own on the same model and a thread that runs one thread of ggml:
it prefills the prompt there while the main step goes on, samples and streams the first token,
exports the prompt's KV cells and hands the sequence to the engine thread, which imports the
cells under a seq id of its own and decodes it with the rest from then on.

Threads: client threads claim the lane and hand it a sequence (`claim`, `start`, `unclaim`,
under its lock); from `start` on the lane's thread holds the sequence and alone writes it, until
it hands the sequence to the engine thread through the inbox. The engine thread only asks
`is_busy`.

While it computes, the lane's thread has a core of its own (`engine/own_core.py`): the step in
flight, whose last node cannot be aborted, goes on on the other cores.

One request at a time and short prompts only: on one thread a prompt step costs about twice
what it does on the engine's threads, so the lane pays off only where the main step is the
longer wait (docs/scheduling.md). A sequence the lane cannot finish the job for (no room, an
error) is handed over without cells and computes its prompt in the main context as usual.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Protocol

import numpy as np

from bindings import Context, ContextSettings, DecodeOutcome, Model, TokenBatch
from engine.own_core import OwnCore
from engine.ownership import claim
from engine.outputs import append_token, sample_rows
from engine.request import FinishReason, Priority
from engine.sequence import Sequence, SequenceState
from engine.tuning import LANE_MIN_CELLS, LANE_THREADS
from sampling.sampler import BatchSampler

log = logging.getLogger("cobatch.engine")

_LANE_SEQ = 0


class HandOver(Protocol):
    """Gives the sequence to the engine thread: its prompt's cells (None: compute them there) and
    why it ended already (its first token was its last), if it did."""

    def __call__(self, seq: Sequence, cells: bytes | None, reason: FinishReason | None,
                 error: str | None = None) -> None: ...


class FirstTokenLane:
    def __init__(self, model: Model, max_prompt_tokens: int, n_ctx: int, swa_full: bool, flash_attn: bool,
                 hand_over: HandOver, wake_engine: Callable[[], None], published: Callable[[], None]) -> None:
        self.max_prompt_tokens = max_prompt_tokens
        self._n_ctx = n_ctx  # the main context's: what the sequence may grow to
        self._context = Context(model, ContextSettings(
            n_ctx=max(LANE_MIN_CELLS, max_prompt_tokens), n_batch=max_prompt_tokens, n_ubatch=max_prompt_tokens, n_seq_max=1,
            n_threads=LANE_THREADS, n_threads_batch=LANE_THREADS, swa_full=swa_full,
            flash_attn=1 if flash_attn else 0))
        self._eog = model.eog_tokens
        self._batch = TokenBatch(max_prompt_tokens)
        self._sampler = BatchSampler(model.n_vocab)
        self._own_core = OwnCore()
        self._hand_over = hand_over
        self._wake_engine = wake_engine
        self._published = published  # wakes the event loops waiting on what the lane streamed
        self._lock = threading.Condition()
        self._claimed = False  # a client thread has reserved the lane for one request
        self._next: Sequence | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="cobatch-first-token", daemon=True)
        self._thread.start()

    def accepts(self, seq: Sequence) -> bool:
        """A request the lane can serve: interactive, a short prompt, nothing that needs the main
        context's machinery for its first token (a grammar, logprobs, prompt scores)."""
        return (seq.request.priority is Priority.INTERACTIVE and 0 < seq.n_prompt <= self.max_prompt_tokens
                and seq.request.max_tokens > 0 and seq.matcher is None and seq.logprobs is None
                and seq.prompt_scores is None)

    def claim(self) -> bool:
        """Reserve the lane for one request (False if it is busy); then `start` or `unclaim`."""
        with self._lock:
            if self._claimed or self._closing:
                return False
            self._claimed = True
            return True

    def is_busy(self) -> bool:
        """A request is reserved for it or in its hands."""
        with self._lock:
            return self._claimed

    def unclaim(self) -> None:
        with self._lock:
            self._claimed = False
            self._lock.notify_all()  # a close() waiting for the claim to end may go on

    def start(self, seq: Sequence) -> None:
        """Give the claimed lane its sequence; the caller no longer writes it."""
        with self._lock:
            self._next = seq
            self._lock.notify_all()

    def close(self) -> None:
        """Finish the request in hand (it is handed over), then free the context."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._thread.join()
        self._context.close()

    # ---- the lane's thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._next is not None or (self._closing and not self._claimed))
                seq, self._next = self._next, None
            if seq is None:
                return
            try:
                self._serve(seq)
            except Exception as exc:  # a bug must not lose the request: the engine computes it
                log.exception("first-token lane failed")
                self._context.seq_rm(_LANE_SEQ)
                if seq.n_generated == 0:
                    self._hand_over(seq, None, None)
                else:
                    self._hand_over(seq, None, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
            finally:
                # Free before the engine wakes: it holds prompt-only steps while the lane is busy,
                # and it finds the sequence handed over when it wakes.
                self.unclaim()
                self._wake_engine()

    def _serve(self, seq: Sequence) -> None:
        claim(seq)
        seq.state = SequenceState.ELSEWHERE
        seq.admitted_at = time.perf_counter()
        self._batch.clear()
        self._batch.add_run(np.asarray(seq.tokens[: seq.n_prompt], dtype=np.int32), 0, _LANE_SEQ, True)
        with self._own_core.held():
            outcome = self._context.decode(self._batch)
        if outcome is not DecodeOutcome.OK:
            self._context.seq_rm(_LANE_SEQ)
            self._hand_over(seq, None, None)
            return
        sampled = sample_rows(self._sampler, self._context.logits(1), [seq], self._n_ctx)
        token = sampled.tokens[0]
        seq.lane_gave_first_token(time.perf_counter())
        reason = append_token(seq, token, self._eog, self._n_ctx)
        self._published()
        cells = None if reason is not None else self._context.export_sequence(_LANE_SEQ)
        self._context.seq_rm(_LANE_SEQ)
        self._hand_over(seq, cells, reason)
