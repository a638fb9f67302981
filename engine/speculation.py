"""Speculative decoding's step: which decoding sequences get draft rows, and how many, so that
only drafts that pay for themselves are verified.

A drafted token costs one more batch row with logits (its share of the weights' pass and one
output projection over the vocabulary) and gains a token when the model agrees with it. With
acceptance rate `a` per drafted token (the i-th is kept only if all before it were, so it is
worth a^i tokens) and the step-cost model's price `c` of one more output row, a step producing
E tokens in T seconds gains from one more draft row worth g tokens exactly when
(E + g) / (T + c) > E / T, that is g > c x E / T. Rows are handed out greedily, interactive
sequences first, then by gain, while g > m x c x E / T holds, the margin m (DRAFT_GAIN_MARGIN)
covering a rate learned on a run of accepted tokens (T counts the rows already added at m times
their cost): at one or a few streams the step's fixed cost dominates and drafts run; when the
batch is compute-bound c x E / T nears one token and no draft pays. E and T are those of a decode
step of every admitted sequence, the step a kept draft token spares a row of (E its sampled
tokens, T without the rows of tokens jump-forward appended, which are fed whether a draft is kept
or not), even when this step also carries prompt chunks (its own tokens per second would price
draft rows as nearly free while sixteen prompts fill, and drafts there cost more than they
saved). One exception to the row-by-row rule: a step with a single output row (one stream)
pays a jump with its first draft row (the step-cost model's multi_output_s: the projection
becomes a matrix product), which one likely row cannot pay back but a run of them can; so rows
are added past where the rule stops once the jump is in, and the best prefix of that order (the
most tokens per weighed second) is granted. A policy may bound the step's predicted time (the
per-token latency target).

Where llama.cpp repacked the weights, its kernels project a step's output rows four at a time and
each row left over alone, rereading the whole projection: a step's output rows cost by the block.
So the rows granted never begin a block they do not fill: they fill the block the step's own rows
began (one stream's single row, fifteen streams'), or end on a multiple of four; past one block,
the rows that fill the step's own are priced as rows without logits (the projection of their
block is computed anyway).

A drafted token the grammar forces needs no output row (the row before it has no logits), and is
kept whenever the token before it is. Kept, it spares only its row in a later step (jump-forward
feeds it there), not a sampling row: it is worth no token itself, and carries the draft on to the
tokens after it.

A draft row's price is the fit's cost of one more row with logits, but never less than its token
cost plus the output projection's share in proportion to the model's weights (per token, the
projection multiplies n_vocab x n_embd weights against the body's). Steps that all carry the same
rows (sixteen streams decoding) cannot tell the fit a row's cost from the step's fixed cost; it
then may split them anyhow, and a row priced at half its cost drafts at sixteen streams and loses.

Acceptance is learned per source and per length of the match a draft continues
(engine/acceptance.py): a long match is a passage being copied, whose continuation is kept for
many tokens, so it earns long drafts, while a chance match of two tokens earns none. A proposal
that got no rows is still judged, for free, against the tokens the sequence goes on to produce
(all of it, as verification would: in structured text its first token is often the easy one), so
rates go on learning where drafts stopped. In a step where even a full draft sure to be kept
would not pay (a crowded batch), no drafts are looked for at all.

What the allotment predicts is then checked against what drafted steps made
(engine/draft_payoff.py): where they made fewer tokens per second than plain steps of as many
sequences, no drafts are looked for there for a while; and from two streams on, a draft row is
priced at no less than drafted steps measured it to cost, and weighed against the tokens per
second plain steps of as many sequences were measured to make. A step that also carries prompt
chunks is never weighed itself (its tokens per second are not like a plain step's), so from two
streams on it drafts only once those plain steps are measured.

A draft model (engine/draft_model.py), when one is loaded, is asked only for the sequences the
model-free sources have nothing for: their drafts cost nothing but a lookup, and where they
exist (text being copied) they are the better guess; the draft model's costs a decode per
drafted position. Its drafts are allotted rows like the others, as their own source.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.acceptance import AcceptanceRates
from engine.draft_model import DraftModel
from engine.draft_payoff import DraftPayoff
from engine.drafts import DRAFT_MODEL, SOURCES, Draft, Drafter, NgramIndex
from engine.jump_forward import JumpForward
from engine.kv_cache import KvCache
from engine.ownership import SingleWriter
from engine.request import Priority
from engine.prompt_scores import scored_positions
from engine.sequence import Sequence
from engine.stats import SpeculationStats
from engine.step_cost import StepCost
from engine.step_plan import Chunk, StepPlan
from engine.tuning import DRAFT_CAP_MIN, DRAFT_GAIN_MARGIN, DRAFT_MODEL_MAX_DRAFT, PAYOFF_MIN_STREAMS


@dataclass
class SourceCounts(SingleWriter):
    drafted: int = 0  # drafted tokens checked by the model
    accepted: int = 0


@dataclass
class Speculator(SingleWriter):
    """Engine thread only: proposes and allots drafts, and learns from their verification."""

    max_draft: int
    drafter: Drafter = field(default_factory=Drafter)
    sources: dict[str, SourceCounts] = field(default_factory=lambda: {s: SourceCounts() for s in SOURCES})
    acceptance: AcceptanceRates = field(default_factory=AcceptanceRates)
    steps_with_drafts: int = 0
    verified_rows: int = 0  # output rows of drafted sequences: their sampling rows plus one per drafted token not forced
    forced_draft_tokens: int = 0  # drafted tokens the grammar forced, verified without logits
    draft_model: DraftModel | None = None
    draft_model_s: float = 0.0  # this step's time in the draft model (outside the main step's cost)
    projection_ratio: float = 0.0  # the output projection's weights over the body's (projection_ratio())
    payoff: DraftPayoff = field(default_factory=DraftPayoff)
    jump: JumpForward | None = None  # the engine's jump-forward: drafted tokens it would force need no logits
    row_block: int = 1  # output rows the projection's kernels multiply at once (4 on repacked weights)
    _steady: int | None = None  # this step's count of admitted sequences, once the step was considered
    _draft_rows: int = 0  # this step's with logits, and the fit's price of the step without them or its forced rows
    _undrafted_s: float = 0.0
    _forced_rows: int = 0  # this step's rows of tokens jump-forward appended,
    _kept_forced: int = 0  # and of drafted tokens the grammar forced, kept
    _forced_row_s: float = 0.0  # the fit's price of a row without logits

    def draft(self, plan: StepPlan, kv: KvCache, cost: StepCost | None, room: int, n_ctx: int,
              limit_s: float | None, running: int = 0) -> None:
        """Attach drafts to the plan's decoding chunks that pay for them, within `room` more rows
        and `limit_s` predicted seconds, with KV blocks reserved for every drafted token.
        `running`: the sequences admitted (decoding or not), whose decode steps are to come."""
        self.draft_model_s = 0.0
        outputs = sum(1 for c in plan.chunks if c.wants_logits)
        steady = max(outputs, running)
        self._steady, self._draft_rows = steady, 0
        # Tokens jump-forward appended, fed before their sequence's sampling row: a kept draft
        # spares a sampling row and its share of the step, never these (they are fed either way).
        forced = plan.n_tokens - outputs if plan.decode_only else 0
        self._forced_rows, self._kept_forced = forced, 0
        self._forced_row_s = 0.0 if cost is None else cost.per_token_s
        if cost is None or room <= 0 or limit_s == 0.0 or self.payoff.holds_back(steady):
            return
        reference = self.payoff.plain_step(steady)
        if reference is None and steady >= PAYOFF_MIN_STREAMS and not plan.decode_only:
            return  # a step with prompt chunks is never weighed itself: it drafts only against measured plain steps
        row_s = self.row_price(cost, steady)
        output_rows = outputs + sum(len(scored_positions(c)) for c in plan.chunks)
        if not self.worth_looking(cost, steady, room, row_s, reference, output_rows):
            return  # looking for drafts costs Python time on every sequence: not where none can pay
        proposals: dict[Sequence, Draft] = {}
        unproposed: dict[Sequence, int] = {}  # the draft limit of sequences the model-free sources left
        for chunk in plan.chunks:
            limit = self._limit(chunk, n_ctx)
            draft = self._proposal(chunk.seq, limit, n_ctx) if limit > 0 else None
            if draft is not None:
                proposals[chunk.seq] = draft
            elif limit > 0:
                unproposed[chunk.seq] = min(limit, DRAFT_MODEL_MAX_DRAFT)
        if unproposed and self.draft_model is not None:
            proposals.update(self._draft_model_proposals(unproposed, n_ctx))
        if not proposals:
            return
        forced_of = {seq: self._forced(seq, draft.tokens) for seq, draft in proposals.items()}
        gains = {seq: _kept_after_forced(self.acceptance.gains(draft, self.max_draft), forced_of[seq])
                 for seq, draft in proposals.items()}
        granted = self.allot(gains, cost, plan.n_tokens, outputs, float(outputs), limit_s, room, steady, row_s,
                             reference, forced, forced_of, self.row_block, output_rows)
        self._undrafted_s = cost.seconds(plan.n_tokens - forced, outputs)
        for i, chunk in enumerate(plan.chunks):
            k = granted.get(chunk.seq, 0)
            if k and kv.try_reserve(chunk.seq, len(chunk.seq.tokens) + k):
                proposal = proposals[chunk.seq]
                tokens, forced_tokens = proposal.tokens[:k], forced_of[chunk.seq][:k]
                plan.chunks[i] = replace(chunk, draft=tokens, granted=replace(proposal, tokens=tokens),
                                         forced=forced_tokens if any(forced_tokens) else ())
                self._draft_rows += k - sum(forced_tokens)
            elif chunk.seq in proposals and chunk.seq.unverified_draft is None:
                chunk.seq.unverified_draft = (proposals[chunk.seq], len(chunk.seq.tokens))
        self.steps_with_drafts += self.drafted

    @property
    def drafted(self) -> bool:
        """Whether the step last considered got drafts."""
        return self._draft_rows > 0

    def step_done(self, decode_only: bool, advanced: int, seconds: float) -> None:
        """The planned step advanced its sequences by `advanced` tokens (sampled, and drafted ones
        kept; not those jump-forward appended after them) in `seconds`; `decode_only`: it carried
        no prompt chunk (only such steps are compared, like with like). Kept drafted tokens the
        grammar forced count as jump-forward's: they are its tokens, fed a step early."""
        if decode_only and self._steady is not None:
            forced_s = (self._forced_rows + self._kept_forced) * self._forced_row_s
            self.payoff.record(self._steady, advanced - self._kept_forced, seconds - forced_s, self._draft_rows,
                               self._undrafted_s)
        self._steady = None

    @staticmethod
    def allot(gains: dict[Sequence, list[float]], cost: StepCost, tokens: int, outputs: int,
              expected_tokens: float, limit_s: float | None = None, room: int | None = None,
              steady: int | None = None, row_s: float | None = None,
              reference: tuple[float, float] | None = None, forced: int = 0,
              forced_drafts: dict[Sequence, tuple[bool, ...]] | None = None, row_block: int = 1,
              output_rows: int | None = None) -> dict[Sequence, int]:
        """Draft rows per sequence (the rule in the module docstring), given the tokens each
        draft row is expected to add (`gains[seq][i]` for its i-th row, non-increasing). The planned
        step feeds `tokens` rows, `outputs` of them sampling rows, and is expected to produce
        `expected_tokens`; `limit_s` bounds its predicted seconds, `room` its extra rows.
        `steady` (more than `outputs`): the sequences whose decode steps are to come. A token is
        then worth what it costs in a decode step of all of them, the step it would otherwise
        come from, not what this step makes per second: one carrying prompt chunks makes few
        tokens in a long time, which would price every draft row as nearly free. `row_s`: a draft
        row's price (default: the fit's). `reference`: the tokens and seconds of that decode step of
        all of them as measured, which replace the fit's price of it. `forced`: rows of `tokens`
        that jump-forward appended; a kept draft token spares none of them, so they count in the
        step's predicted seconds but not in what a token is worth. `forced_drafts[seq][i]`: the
        grammar forces the sequence's i-th drafted token, so the row before it needs no logits.
        `row_block`: the projection multiplies this many output rows at once and each row left
        over alone, so what is granted never begins a block of the step's output rows
        (`output_rows`, default `outputs`) that it does not fill: it fills the block the step's
        own rows began, or ends on a multiple of the block."""
        row_s = cost.per_token_s + cost.per_output_s if row_s is None else row_s
        forced_drafts = forced_drafts or {}
        output_rows = outputs if output_rows is None else output_rows
        started = -(-output_rows // row_block) * row_block  # the output rows the step's blocks hold
        fill = _fill_rows(output_rows, row_block)

        def may_stop(rows_with_logits: int) -> bool:
            end = output_rows + rows_with_logits
            return end <= started or end % row_block == 0

        step_s = cost.seconds(tokens, outputs)
        # A step with one output row pays the jump to a matrix product with its first draft row:
        # that row is judged with the rows after it, as the best prefix of the greedy order.
        jump_s = cost.multi_output_s if outputs == 1 else 0.0
        ref_s = cost.seconds(tokens - forced, outputs)
        if reference is not None:
            expected_tokens, ref_s = reference
        elif steady is not None and steady > outputs:
            ref_s, expected_tokens = cost.seconds(steady, steady), expected_tokens * steady / max(outputs, 1)
        granted = dict.fromkeys(gains, 0)
        best, best_rate = {}, expected_tokens / ref_s
        predicted_s, weighed_s = step_s, ref_s  # the latter with each added cost times the margin
        rows = logit_rows = 0
        left = float("inf") if room is None else room
        while left > 0:
            open_ = [seq for seq in gains if granted[seq] < len(gains[seq])]
            if not open_:
                break
            pick = max(open_, key=lambda s: (s.request.priority is Priority.INTERACTIVE, gains[s][granted[s]]))
            gain = gains[pick][granted[pick]]
            marks = forced_drafts.get(pick, ())
            is_forced = granted[pick] < len(marks) and marks[granted[pick]]
            if is_forced:
                # A forced token kept spares its row in a later step (jump-forward would feed it
                # there), not a sampling row: worth nothing itself, it costs its row only when
                # the draft misses before it, and carries the draft on to the tokens after it.
                added_s, net_s, gain = cost.per_token_s, cost.per_token_s * (1.0 - gain), 0.0
            else:
                # A row that fills a block the step's own rows began costs what a row without
                # logits does: that block's projection is computed anyway.
                added_s = cost.per_token_s if logit_rows < fill else row_s + (jump_s if logit_rows == 0 else 0.0)
                net_s = added_s
            if limit_s is not None and predicted_s + added_s > limit_s:
                break
            # Past the jump, rows cost alike and gains only shrink: once one does not pay, none
            # after does (but the rows that fill a block begun come together).
            if (rows and not is_forced and may_stop(logit_rows)
                    and gain * weighed_s <= DRAFT_GAIN_MARGIN * added_s * expected_tokens):
                break
            granted[pick] += 1
            expected_tokens += gain
            predicted_s += added_s
            weighed_s += DRAFT_GAIN_MARGIN * net_s
            left -= 1
            rows += 1
            logit_rows += not is_forced
            if may_stop(logit_rows) and expected_tokens / weighed_s > best_rate:
                best, best_rate = {seq: k for seq, k in granted.items() if k}, expected_tokens / weighed_s
        return best

    def worth_looking(self, cost: StepCost, steady: int, room: int, row_s: float,
                      reference: tuple[float, float] | None, output_rows: int) -> bool:
        """Whether a draft sure to be kept would pay in this step: its longest at `row_s` a row,
        or the rows that fill the block of output rows the step began (priced as allot does)."""
        fill = _fill_rows(output_rows, self.row_block)
        return (_a_certain_draft_pays(cost, steady, min(room, self.max_draft), row_s, reference)
                or _a_certain_draft_pays(cost, steady, min(room, fill), cost.per_token_s, reference))

    def row_price(self, cost: StepCost, streams: int = 1) -> float:
        """Seconds one more row with logits adds to a step of `streams` decoding (the module
        docstring); from two streams on, never less than drafted steps measured."""
        fitted = max(cost.per_token_s + cost.per_output_s, (1.0 + self.projection_ratio) * cost.per_token_s)
        return max(fitted, self.payoff.row_s) if streams >= PAYOFF_MIN_STREAMS else fitted

    def stats(self) -> SpeculationStats:
        return SpeculationStats(
            drafted={s: c.drafted for s, c in self.sources.items()},
            accepted={s: c.accepted for s, c in self.sources.items()},
            steps_with_drafts=self.steps_with_drafts, verified_rows=self.verified_rows)

    def verified(self, seq: Sequence, draft: Draft, accepted: int, forced: tuple[bool, ...] = ()) -> None:
        """A draft was checked and its first `accepted` tokens kept; `forced[i]`: its i-th token
        needed no logits."""
        counts = self.sources[draft.source]
        counts.drafted += len(draft.tokens)
        counts.accepted += accepted
        self.verified_rows += len(draft.tokens) + 1 - sum(forced)
        self.forced_draft_tokens += sum(forced)
        self._kept_forced += sum(forced[:accepted])
        seq.unverified_draft = None  # judged by the model instead
        self._learn(seq, draft, accepted)
        seq.drafted_tokens += len(draft.tokens)
        seq.accepted_tokens += accepted

    def sampled(self, seq: Sequence, token: int) -> None:
        """The step is about to append `token` to `seq`: judge the proposal it had no rows for,
        as far as its tokens are known (a whole draft, as verification would have, not just its
        first token: in structured text the first is often the easy one)."""
        if seq.unverified_draft is None:
            return
        draft, position = seq.unverified_draft
        proposed, known = draft.tokens, [*seq.tokens[position:], token]
        kept = 0
        while kept < min(len(proposed), len(known)) and proposed[kept] == known[kept]:
            kept += 1
        if kept < len(proposed) and kept == len(known):
            return  # right so far: judged when the rest is known
        seq.unverified_draft = None
        self._learn(seq, draft, kept)

    def _learn(self, seq: Sequence, draft: Draft, kept: int) -> None:
        self.acceptance.learn(draft, kept)
        if kept == len(draft.tokens):
            seq.draft_cap = min(self.max_draft, 2 * seq.draft_cap + 1)  # 3, 7, 15, 31: engine/tuning.py
        else:
            seq.draft_cap = max(DRAFT_CAP_MIN, seq.draft_cap // 2)

    def finished(self, seq: Sequence) -> None:
        """Its output may propose drafts for later requests of its scope; the draft model's cells
        for it are freed."""
        if seq.request.speculative and seq.n_generated:
            self.drafter.finished(seq.request.draft_scope, seq.tokens[seq.n_prompt:])
        if self.draft_model is not None:
            self.draft_model.release(seq)

    def _limit(self, chunk: Chunk, n_ctx: int) -> int:
        """How many tokens the chunk's sequence may have drafted (0: none)."""
        seq = chunk.seq
        if (not seq.request.speculative or not chunk.wants_logits or not seq.is_decoding
                or seq.scores_prompt or chunk.draft):
            return 0
        # Drafted tokens and the one sampled after them must fit max_tokens and the context.
        return max(0, min(self.max_draft, seq.draft_cap, seq.token_budget(n_ctx) - 1))

    def _forced(self, seq: Sequence, draft: tuple[int, ...]) -> tuple[bool, ...]:
        """Which drafted tokens jump-forward would append unsampled (as it does for this sequence:
        not with logprobs). Their rows need no logits, which at one stream spares the projection
        most of a step's time."""
        if self.jump is None or seq.matcher is None or seq.logprobs is not None:
            return ()
        forced = self.jump.forced_positions(seq.matcher, draft)
        return forced if any(forced) else ()

    def _draft_model_proposals(self, limits: dict[Sequence, int], n_ctx: int) -> dict[Sequence, Draft]:
        assert self.draft_model is not None
        spent = self.draft_model.seconds
        drafted = self.draft_model.propose(limits)
        self.draft_model_s = self.draft_model.seconds - spent
        proposals = {}
        for seq, tokens in drafted.items():
            draft = Draft(tokens, DRAFT_MODEL)  # no match: its rate is one bucket's
            if seq.matcher is not None:
                draft = _within_grammar(seq, draft, n_ctx)
            if draft is not None:
                proposals[seq] = draft
        return proposals

    def _proposal(self, seq: Sequence, limit: int, n_ctx: int) -> Draft | None:
        """The model-free sources' draft of at most `limit` tokens."""
        if seq.ngrams is None:
            seq.ngrams = NgramIndex()
        prompt = None
        if seq.matcher is not None and self.drafter.words is not None:
            if seq.prompt_words is None:
                seq.prompt_words = self.drafter.words.of(seq.tokens[:seq.n_prompt])
            prompt = seq.prompt_words
        draft = self.drafter.propose(seq.ngrams, seq.tokens, seq.request.draft_scope, limit, prompt)
        if draft is not None and seq.matcher is not None:
            draft = _within_grammar(seq, draft, n_ctx)
        return draft


def projection_ratio(n_vocab: int, n_embd: int, n_params: int) -> float:
    """The output projection's weights over the rest that a token multiplies (0: not known).
    The input embedding is a lookup, and with tied embeddings the projection is that same table;
    an untied model's second table counts in its body here, which only lowers the ratio."""
    projection = n_vocab * n_embd
    body = n_params - projection
    return projection / body if body > 0 else 0.0


def _a_certain_draft_pays(cost: StepCost, outputs: int, rows: int, row_s: float | None = None,
                          reference: tuple[float, float] | None = None) -> bool:
    """Whether `rows` draft rows sure to be kept would pass the allotment's rule in a decode step
    of `outputs` sequences (`reference`: its tokens and seconds as measured); none: no rows."""
    if rows <= 0:
        return False
    tokens, step_s = reference if reference is not None else (float(outputs), cost.seconds(outputs, outputs))
    row_s = cost.per_token_s + cost.per_output_s if row_s is None else row_s
    added_s = rows * row_s + (cost.multi_output_s if outputs == 1 else 0.0)
    return (tokens + rows) / (step_s + DRAFT_GAIN_MARGIN * added_s) > tokens / step_s


def _fill_rows(output_rows: int, row_block: int) -> int:
    """Rows with logits that fill the last block a step's own output rows began, where those
    already make a matrix product (a block or more); 0 where blocks are one row."""
    return -output_rows % row_block if output_rows >= row_block else 0


def _kept_after_forced(gains: list[float], forced: tuple[bool, ...]) -> list[float]:
    """A forced drafted token is kept whenever the one before it is: its chance is that one's."""
    gains = list(gains)
    for i in range(1, min(len(gains), len(forced))):
        if forced[i]:
            gains[i] = gains[i - 1]
    return gains


def _within_grammar(seq: Sequence, draft: Draft, n_ctx: int) -> Draft | None:
    """The draft cut before the first token the sequence's grammar would refuse."""
    matcher = seq.matcher.fork()
    budget = seq.token_budget(n_ctx)
    kept = 0
    for token in draft.tokens:
        if not matcher.is_allowed(token, budget) or getattr(matcher, "released", False):
            break
        matcher.advance(token)
        kept += 1
        budget -= 1
        if matcher.is_finished:
            break
    return replace(draft, tokens=draft.tokens[:kept]) if kept else None
