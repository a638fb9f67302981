"""The engine core: KV cache, scheduler, runner and sampler, advanced one step at a time.

No threads here: engine/loop.py drives it, and the engine thread alone writes the core and
everything it holds (`claim_for_this_thread`). One step reads top to bottom: schedule, draft
(tokens guessed ahead for decoding sequences, where they pay: engine/speculation.py), build the
batch (the runner returns which sequence owns each output row), decode, sample, apply outputs
(verifying drafts: engine/verify.py).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Protocol

from bindings import DecodeOutcome
from engine.debug import ENABLED as DEBUG_CHECKS
from engine.draft_model import DraftModel
from engine.drafts import Drafter
from engine.ownership import SingleWriter, claim_all
from engine.config import EngineConfig
from engine.jump_forward import JumpForward
from engine.kv_cache import KvCache
from engine.outputs import SampledRows, append_token, flush_text, sample_rows
from engine.prefix_reuse import PrefixReuse
from engine.prompt_scores import finished_scoring, max_scored_rows
from engine.prompt_words import PromptWords
from engine.request import FinishReason, Priority
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.step_cost import StepCostModel
from engine.speculation import Speculator, projection_ratio
from engine.step_plan import Chunk, StepPlan
from engine.stats import RECENT_STEPS, EngineStats, StatsBoard, StepProfile, StepRecord, TierStats
from engine.thread_governor import ThreadGovernor
from engine.tuning import LANE_HOLD_MAX_S, REPACKED_ROW_BLOCK
from engine.verify import verify
from sampling.sampler import BatchSampler

log = logging.getLogger("cobatch.engine")


class DecodeWatch(Protocol):
    """Told when each llama_decode starts and ends (the loop's interrupt window)."""

    def begin(self, interruptible: bool, kind: str, threads: int, batch_only: bool = False) -> None: ...

    def end(self, completed: bool) -> None: ...


class _Unwatched:
    def begin(self, interruptible: bool, kind: str, threads: int, batch_only: bool = False) -> None:
        pass

    def end(self, completed: bool) -> None:
        pass


class EngineCore(SingleWriter):
    def __init__(
        self,
        model: Any,
        runner: Any,
        config: EngineConfig,
        board: StatsBoard | None = None,
        watch: DecodeWatch | None = None,
        on_finished: Callable[[Sequence], None] = lambda seq: None,
        lane_busy: Callable[[], bool] = lambda: False,
        draft_model: DraftModel | None = None,
    ) -> None:
        self.config = cfg = config
        self.model = model
        self.runner = runner
        self.n_ctx: int = runner.n_ctx
        holders = cfg.cache_holders if cfg.prefix_cache else 0
        self.kv_cache = KvCache(
            runner.context, self.n_ctx, cfg.block_size, running_ids=range(cfg.sequence_ids),
            holder_ids=range(cfg.sequence_ids, cfg.sequence_ids + holders), prefix_cache=cfg.prefix_cache,
            max_cached_blocks=int(cfg.cache_max_fraction * (self.n_ctx // cfg.block_size)),
            reuse=PrefixReuse(cfg.idle_cells_rate),
        )
        self.step_cost = StepCostModel()
        self.scheduler = Scheduler(self.kv_cache, cfg.max_running, cfg.step_token_budget,
                                   cfg.scheduling_policy(self.step_cost), max_scored_rows(model.n_vocab))
        self.sampler = BatchSampler(model.n_vocab)

        def tokenize(text: str) -> list[int]:  # text the model continues: no BOS
            return model.tokenize(text, add_bos=False)

        self.jump = JumpForward(tokenize, model.token_bytes) if cfg.jump_forward else None
        self.tokens_forced = 0  # appended by jump-forward, unsampled
        self.speculator = Speculator(
            cfg.speculative_max_draft, drafter=Drafter(words=PromptWords(tokenize, model.token_bytes)),
            draft_model=draft_model, jump=self.jump, row_block=REPACKED_ROW_BLOCK if model.weights_repacked else 1,
            projection_ratio=projection_ratio(model.n_vocab, model.n_embd, model.n_params)) if cfg.speculative else None
        self.thread_governor = ThreadGovernor(cfg.n_threads, runner.interrupter, adaptive=cfg.adaptive_threads)
        self.profiles = {"decode": StepProfile(), "mixed": StepProfile()}
        self.steps_run = 0  # llama_decode calls, interrupted ones included
        self.steps_interrupted = 0
        self.lane_first_tokens = 0  # sequences adopted with their first token from the lane
        self._finished = {p: 0 for p in Priority}
        self._tier_tokens = {p: [0, 0] for p in Priority}  # prompt tokens computed, tokens produced
        self._tenant_tokens: dict[str, int] = {}  # tokens produced, by tenant (a share over any window)
        self.recent_steps: deque[StepRecord] = deque(maxlen=RECENT_STEPS)
        self._watch = watch or _Unwatched()
        self._on_finished = on_finished
        self._cut_by_governor = False
        self._lane_busy = lane_busy  # the first-token lane is computing a prompt
        self._held_since: float | None = None  # batch work has waited for the lane since then
        self.board = board or StatsBoard()
        self.publish_stats()

    @property
    def stats(self) -> EngineStats:
        """The last published snapshot."""
        stats = self.board.latest
        assert stats is not None
        return stats

    def claim_for_this_thread(self) -> None:
        """The calling thread (the engine thread, when it starts) now alone writes the core."""
        claim_all(self)

    def add(self, seq: Sequence) -> None:
        seq.added_at_step = self.steps_run
        self.scheduler.add(seq)
        reason = self._jump_forward(seq)  # a document's opening is often forced: it joins the prefill
        if reason is not None:
            self.finish(seq, reason)

    def adopt(self, seq: Sequence, cells: bytes | None, reason: FinishReason | None, error: str | None = None) -> None:
        """Take over a sequence whose first token came from the first-token lane: its prompt's
        cells are imported under a seq id of its own; without cells, or without room for them,
        it computes them here like any new request."""
        seq.added_at_step = self.steps_run
        if seq.first_token_from_lane:
            seq.first_token_step = self.steps_run  # served outside the steps: none passed
        self.lane_first_tokens += seq.first_token_from_lane
        if reason is not None:
            self.finish(seq, reason, error)
            return
        if cells is None or not self.scheduler.adopt(seq, lambda seq_id: self.runner.import_cells(seq_id, cells)):
            self.add(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> bool:
        """One engine step; False when there was nothing to decode."""
        if self._hold_for_lane():
            return False
        clock = time.perf_counter
        t0 = clock()
        self.step_cost.expect_threads(self.thread_governor.current)
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return False
        if self.speculator is not None:
            self.speculator.draft(plan, self.kv_cache, self.step_cost.estimate(),
                                  self.scheduler.step_token_budget - plan.n_tokens, self.n_ctx,
                                  self.scheduler.policy.draft_limit_s, len(self.scheduler.running))
            if self.speculator.drafted:
                self.scheduler.policy.step_drafted(plan)
        carried = _carried_by_tier(plan)
        t1 = clock()
        # The draft model's decodes are its own cost, not the main step's (engine/draft_model.py).
        draft_s = 0.0 if self.speculator is None else self.speculator.draft_model_s
        rows = self.runner.build_batch(plan)
        kind = _step_kind(plan)
        depth = max(c.start + c.n_rows for c in plan.chunks)
        threads = self.thread_governor.choose(plan.n_tokens, self.runner.n_outputs, depth)
        self.runner.set_threads(threads)
        self.publish_stats()  # readers see this step's admissions while it decodes
        t2 = clock()
        batch_only = all(c.seq.request.priority is Priority.BATCH for c in plan.chunks)
        outcome = self._decode(plan.interruptible, kind, threads, batch_only)
        t3 = clock()
        if outcome is not DecodeOutcome.OK:
            self._recover(outcome)
            self._record_step(carried, (0, 0), clock() - t0, threads, done=False,
                              interrupted=outcome is DecodeOutcome.ABORTED)
            return True
        self.scheduler.step_done(plan)
        self.runner.record_prompt_scores()
        for seq in finished_scoring(plan.chunks):  # max_tokens 0: scored, nothing to generate
            self.finish(seq, FinishReason.LENGTH)
        logits = self.runner.output_logits()
        # A sequence with a draft owns consecutive rows: the first is sampled with everyone's.
        firsts = [i for i in range(len(rows)) if i == 0 or rows[i] is not rows[i - 1]]
        seqs = [rows[i] for i in firsts]
        first_logits = logits if len(firsts) == len(rows) else logits[firsts]
        sampled = sample_rows(self.sampler, first_logits, seqs, self.n_ctx) if rows else None
        t4 = clock()
        lengths_before = [len(seq.tokens) for seq in seqs]
        forced_before = self.tokens_forced
        if sampled is not None:
            drafts = {c.seq: c for c in plan.chunks if c.draft}
            ends = [*firsts[1:], len(rows)]
            self._apply(seqs, sampled, lambda i: logits[firsts[i]:ends[i]], drafts)
        t5 = clock()
        made = [0, 0]  # interactive, batch
        for seq, before in zip(seqs, lengths_before):
            n = len(seq.tokens) - before
            made[seq.request.priority is Priority.BATCH] += n
            self._tenant_tokens[seq.request.tenant] = self._tenant_tokens.get(seq.request.tenant, 0) + n
        profile = self.profiles["decode" if kind == "decode" else "mixed"]
        profile.record((t1 - t0 - draft_s, draft_s, t2 - t1, t3 - t2, t4 - t3, t5 - t4), plan.n_tokens,
                       made[0] + made[1])
        self._record_step(carried, made, t5 - t0, threads, done=True, interrupted=False)
        self.step_cost.record(plan.n_tokens, self.runner.n_outputs, t5 - t0 - draft_s, threads)
        if self.speculator is not None:
            advanced = made[0] + made[1] - (self.tokens_forced - forced_before)
            self.speculator.step_done(kind == "decode", advanced, t5 - t0 - draft_s)
        if DEBUG_CHECKS:
            self.kv_cache.check()
        return True

    def _hold_for_lane(self) -> bool:
        """Whether this turn waits for the first-token lane. A step of batch work would share the
        two cores with the lane's prompt (three ggml threads on two cores slow both), which is
        handed over within tens of milliseconds; interactive sequences already decoding do not
        wait, and batch work waits at most LANE_HOLD_MAX_S before a step of its own."""
        now = time.perf_counter()
        if not self._lane_busy() or any(s.is_decoding and s.request.priority is Priority.INTERACTIVE
                                        for s in self.scheduler.running):
            self._held_since = None
            return False
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since < LANE_HOLD_MAX_S:
            return True
        self._held_since = None  # waited its bound: one step of its own, then it may wait again
        return False

    def _record_step(self, carried: tuple[int, int, int, int], made: tuple[int, int] | list[int], seconds: float,
                     threads: int, done: bool, interrupted: bool) -> None:
        self.recent_steps.append(StepRecord(self.steps_run, time.perf_counter(), seconds, *carried, *made,
                                            threads, interrupted))
        if done:  # a failed step's prompt tokens are fed again later, and counted then
            for tier, prompt, tokens in ((Priority.INTERACTIVE, carried[2], made[0]),
                                         (Priority.BATCH, carried[3], made[1])):
                counts = self._tier_tokens[tier]
                counts[0] += prompt
                counts[1] += tokens

    def finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        seq.finish_reason = reason
        try:
            flush_text(seq)
            self.scheduler.finish(seq)
            if self.speculator is not None:
                self.speculator.finished(seq)
        finally:  # a bookkeeping bug fails the step, but the client still gets its answer
            self._finished[seq.request.priority] += 1
            self._on_finished(seq)
            seq.handle.publish_result(seq.result(error))

    def fail_running(self, exc: Exception) -> None:
        message = f"engine step failed: {type(exc).__name__}: {exc}"
        for seq in list(self.scheduler.running):
            try:
                self.finish(seq, FinishReason.ERROR, error=message)
            except Exception:  # its client has its answer (finish answers first); go on with the rest
                log.exception("failing %s after a failed step", seq.request_id)

    def publish_stats(self) -> None:
        try:
            self.board.publish(self._snapshot())
        except Exception:  # readers keep the last snapshot; the step's own work is unaffected
            log.exception("publishing the engine's stats failed")

    def take_profiles(self, reset: bool) -> dict[str, StepProfile]:
        """Copies of the step profiles; `reset` starts them afresh."""
        copies = {kind: p.copy() for kind, p in self.profiles.items()}
        if reset:
            self.profiles = {kind: StepProfile() for kind in self.profiles}
        return copies

    # ---- the step's parts -------------------------------------------------------------------
    def _decode(self, interruptible: bool, kind: str, threads: int, batch_only: bool) -> DecodeOutcome:
        self._watch.begin(interruptible, kind, threads, batch_only)
        self.thread_governor.begin()
        outcome = DecodeOutcome.ABORTED
        try:
            outcome = self.runner.decode()
        finally:
            self._cut_by_governor = self.thread_governor.end(outcome is DecodeOutcome.OK)
            self._watch.end(outcome is DecodeOutcome.OK)
            self.steps_run += 1
        return outcome

    def _apply(self, rows: list[Sequence], sampled: SampledRows, draft_rows: Callable[[int], Any],
               drafts: dict[Sequence, Chunk]) -> None:
        now = time.perf_counter()
        interactive_intervals = []
        for i, (seq, token) in enumerate(zip(rows, sampled.tokens)):
            if i in sampled.dead_ends:
                self.finish(seq, FinishReason.ERROR, error=sampled.dead_ends[i])
                continue
            interval = seq.token_delivered(now, self.steps_run)
            # The plan answers for one step; an interval that spans a step leaving this sequence
            # out (another's prompt alone, an aborted step) says nothing about it.
            if interval is not None and interval.back_to_back and seq.request.priority is Priority.INTERACTIVE:
                interactive_intervals.append(interval.seconds)
            error = None
            try:
                if seq in drafts:
                    reason, error = self._verify(seq, token, draft_rows(i), drafts[seq])
                else:
                    if self.speculator is not None:
                        self.speculator.sampled(seq, token)
                    reason = append_token(seq, token, self.model.eog_tokens, self.n_ctx)
                if reason is None:
                    reason = self._jump_forward(seq)
            except Exception as exc:
                self.finish(seq, FinishReason.ERROR, error=f"{type(exc).__name__}: {exc}")
                continue
            if reason is not None:
                self.finish(seq, reason, error)
        if interactive_intervals:
            self.scheduler.interactive_intervals(interactive_intervals)

    def _verify(self, seq: Sequence, first: int, logits: Any, chunk: Chunk) -> tuple[FinishReason | None, str | None]:
        """Keep the drafted tokens the model confirms (engine/verify.py); their cells stay, the
        rejected ones' go."""
        verified = verify(self.sampler, logits, seq, first, chunk.draft, self.model.eog_tokens, self.n_ctx,
                          chunk.forced)
        self.kv_cache.computed(seq, verified.accepted)
        self.kv_cache.drop_uncomputed(seq)
        assert self.speculator is not None and chunk.granted is not None
        self.speculator.verified(seq, chunk.granted, verified.accepted, chunk.forced)
        return verified.reason, verified.error

    def _jump_forward(self, seq: Sequence) -> FinishReason | None:
        """Append the tokens the grammar forces next, and those a tight budget leaves no choice
        for (the one way to close the document in time); why the sequence ends, if it does."""
        if self.jump is None or seq.matcher is None or seq.logprobs is not None:
            return None  # logprobs need the model's distribution at every position
        while True:
            appended = 0
            for token in self.jump.forced_tokens(seq.matcher):
                # The budget rule the sampler applies: the document must still close in time.
                if not seq.matcher.is_allowed(token, seq.token_budget(self.n_ctx)):
                    break
                reason = self._append_forced(seq, token)
                appended += 1
                if reason is not None:
                    return reason
            token = self._only_token(seq)
            if token is not None:
                reason = self._append_forced(seq, token)
                if reason is not None:
                    return reason
            elif not appended:
                return None

    def _only_token(self, seq: Sequence) -> int | None:
        """The token a tight budget leaves as the only choice, in the model's spelling."""
        budget = seq.token_budget(self.n_ctx)
        text = seq.matcher.only_text(budget)
        token = None if text is None else self.jump.token_spelling(text)
        return token if token is not None and seq.matcher.is_allowed(token, budget) else None

    def _append_forced(self, seq: Sequence, token: int) -> FinishReason | None:
        seq.forced_tokens += 1
        self.tokens_forced += 1
        return append_token(seq, token, self.model.eog_tokens, self.n_ctx)

    def _recover(self, outcome: DecodeOutcome) -> None:
        # llama.cpp rolls back a failed batch, so only the choice of who runs next changes.
        if outcome is DecodeOutcome.ABORTED:
            if not self._cut_by_governor:  # a step the thread governor cut short is simply redone
                self.steps_interrupted += 1
            self.scheduler.step_aborted()
        elif outcome is DecodeOutcome.KV_FULL:
            alone = self.scheduler.kv_full()
            if alone is not None:
                self.finish(alone, FinishReason.ERROR, error="the KV cache has no room for it")

    def _snapshot(self) -> EngineStats:
        scheduler = self.scheduler
        tiers = {
            p.value: TierStats(
                waiting=scheduler.waiting_in(p),
                running=scheduler.n_running(p),
                admitted=scheduler.tiers[p].admitted,
                suspensions=scheduler.tiers[p].suspensions,
                preemptions=scheduler.tiers[p].preemptions,
                finished=self._finished[p],
                prompt_tokens=self._tier_tokens[p][0],
                tokens_generated=self._tier_tokens[p][1],
            )
            for p in Priority
        }
        return EngineStats(
            running=len(scheduler.running),
            waiting={name: t.waiting for name, t in tiers.items()},
            kv_cells_used=self.kv_cache.cells_held(),
            kv_cells_total=self.n_ctx,
            kv=self.kv_cache.stats(),
            tokens_prefilled=scheduler.tokens_prefilled,
            tokens_forced=self.tokens_forced,
            suspensions=sum(t.suspensions for t in tiers.values()),
            preemptions=sum(t.preemptions for t in tiers.values()),
            steps=self.steps_run,
            steps_interrupted=self.steps_interrupted,
            tiers=tiers,
            decode_threads=self.thread_governor.current,
            thread_switches=self.thread_governor.switches,
            interactive_token_target_ms=None if scheduler.policy.token_target_s is None
            else scheduler.policy.token_target_s * 1000.0,
            latency_bounded_steps=scheduler.policy.bounded_steps,
            batch_rows_granted=scheduler.policy.batch_rows_granted,
            latency_calibration=scheduler.policy.calibration,
            lane_first_tokens=self.lane_first_tokens,
            speculation=None if self.speculator is None else self.speculator.stats(),
            tenants_waiting=scheduler.policy.waiting_by_tenant(),
            tenant_tokens_produced=dict(self._tenant_tokens),
            recent_steps=tuple(self.recent_steps),
        )


def _carried_by_tier(plan: StepPlan) -> tuple[int, int, int, int]:
    """Decode rows and prompt tokens of the plan, interactive then batch."""
    rows, prompt = [0, 0], [0, 0]
    for c in plan.chunks:
        batch = c.seq.request.priority is Priority.BATCH
        if c.seq.is_decoding:
            rows[batch] += c.n_rows
        else:
            prompt[batch] += c.length
    return rows[0], rows[1], prompt[0], prompt[1]


def _step_kind(plan: StepPlan) -> str:
    """Decode rows only, prompt chunks only, or both (profiles put the last two together)."""
    if plan.decode_only:
        return "decode"
    return "mixed" if any(c.seq.is_decoding for c in plan.chunks) else "prompt"
