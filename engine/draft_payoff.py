"""Whether drafts have paid, as measured: tokens per second of decode steps that carried drafts
against those that did not, per count of sequences decoding.

The allotment (engine/speculation.py) predicts what a draft row costs from the step-cost fit.
Where every step has the same rows, that fit cannot tell a row's cost from the step's fixed cost,
and at sixteen streams on two cores a row costs about what each of the sixteen does: drafts that
the prediction passes then lose. So the prediction is checked against the outcome: once a few
drafted steps at a count made fewer tokens per second than the plain steps at that count, no
drafts are looked for there, until enough plain steps have passed for the evidence to be stale
(the machine's speed and the text both change). A verdict needs plain steps too: where some
sequence has a draft at every step, drafts are held back every other step until enough plain
steps are in. One stream is left to the prediction: its
drafted steps vary its rows, and its plain steps' speed varies with the text (a JSON document's
forced runs), which would stop drafts for whatever comes next.

A verdict takes dozens of steps at one count, and a wave of requests passes through most counts
in fewer. So each drafted step of two or more streams also says what its draft rows cost: its
seconds beyond what plain steps at its count take (the fit's price of the same step without them
until enough plain steps are in), per draft row. Their moving
average, weighted by rows, is a floor under the allotment's row price (engine/speculation.py):
past sixteen rows a row costs more than the fit, fed mostly by prompt chunks and sixteen-row
steps, can see, and more in a step of hundreds of rows than in one of a few. The plain steps'
own tokens per second are then what a draft row is weighed against, not the fit's price of such
a step, which its other shapes of step move by more than a draft's margin.

A step's tokens here are its sequences' advances (sampled tokens and kept drafts) and its seconds
leave out its forced rows (jump-forward's tokens, at the fit's price of a row without logits):
those are fed whether a draft is kept or not. Counted in, they would raise a structured step's
tokens per second and value a kept draft at that, when what it spares is a sampling row and its
share of the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.ownership import SingleWriter
from engine.tuning import (
    DRAFT_ROW_WEIGHT, PAYOFF_MIN_STEPS, PAYOFF_MIN_STREAMS, PAYOFF_RETRY_STEPS, PAYOFF_WEIGHT,
)


@dataclass
class _Mean:
    """A moving average that is a plain mean until its weight takes over."""

    weight: float
    value: float = 0.0
    count: int = 0

    def add(self, x: float) -> None:
        self.count += 1
        self.value += max(self.weight, 1.0 / self.count) * (x - self.value)


@dataclass
class _Rate:
    tokens: _Mean = field(default_factory=lambda: _Mean(PAYOFF_WEIGHT))  # over steps: tokens made,
    seconds: _Mean = field(default_factory=lambda: _Mean(PAYOFF_WEIGHT))  # and seconds taken

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens.add(tokens)
        self.seconds.add(seconds)

    @property
    def steps(self) -> int:
        return self.tokens.count

    @property
    def per_second(self) -> float:
        return self.tokens.value / self.seconds.value


@dataclass
class DraftPayoff(SingleWriter):
    """Engine thread only."""

    plain: dict[int, _Rate] = field(default_factory=dict)
    drafted: dict[int, _Rate] = field(default_factory=dict)
    quiet: dict[int, int] = field(default_factory=dict)  # plain steps since drafts were judged to lose there
    # What draft rows were measured to add to steps of two streams or more, over recent drafted
    # steps: seconds beyond the step without them, and their rows.
    row_seconds: _Mean = field(default_factory=lambda: _Mean(DRAFT_ROW_WEIGHT))
    row_count: _Mean = field(default_factory=lambda: _Mean(DRAFT_ROW_WEIGHT))

    def record(self, decoding: int, tokens: int, seconds: float, draft_rows: int = 0,
               undrafted_s: float = 0.0) -> None:
        """A decode step of `decoding` sequences made `tokens` in `seconds`, with `draft_rows` rows
        beyond the step the fit prices at `undrafted_s` (used until plain steps at this count say
        what such a step takes)."""
        if seconds <= 0.0 or decoding < PAYOFF_MIN_STREAMS:
            return
        drafted = draft_rows > 0
        if drafted:
            # Against the plain steps at this count where there are enough: the fit's price of a
            # step moves with every other shape of step it is fed, and an error in it lands on
            # a handful of draft rows.
            measured = self.plain_step(decoding)
            base_s = measured[1] if measured is not None else undrafted_s
            if base_s > 0.0:
                self.row_seconds.add(max(0.0, seconds - base_s))
                self.row_count.add(draft_rows)
        (self.drafted if drafted else self.plain).setdefault(decoding, _Rate()).add(tokens, seconds)
        if decoding in self.quiet:
            self.quiet[decoding] += not drafted
            if self.quiet[decoding] >= PAYOFF_RETRY_STEPS:
                del self.quiet[decoding], self.drafted[decoding]  # stale: try again
        elif self._drafts_lost(decoding):
            self.quiet[decoding] = 0

    @property
    def row_s(self) -> float:
        """Seconds per draft row (0: not measured yet), weighted by rows: a row of a large
        drafted step costs more than one of a small step, and large steps are where drafts lose."""
        return self.row_seconds.value / self.row_count.value if self.row_count.value else 0.0

    def plain_step(self, decoding: int) -> tuple[float, float] | None:
        """Tokens and seconds of a plain decode step at this count, as measured (None: too few
        such steps yet)."""
        plain = self.plain.get(decoding)
        if plain is None or plain.steps < PAYOFF_MIN_STEPS:
            return None
        return plain.tokens.value, plain.seconds.value

    def holds_back(self, decoding: int) -> bool:
        """Whether the next step at this count goes without drafts: they lost there, or the
        verdict still lacks the plain steps to weigh them against (every other step then)."""
        if self.loses(decoding):
            return True
        drafted, plain = self.drafted.get(decoding), self.plain.get(decoding)
        plain_steps = plain.steps if plain is not None else 0
        return (decoding >= PAYOFF_MIN_STREAMS and drafted is not None and plain_steps < PAYOFF_MIN_STEPS
                and drafted.steps > plain_steps)

    def loses(self, decoding: int) -> bool:
        """Whether drafted steps at this count were measured to make fewer tokens per second
        (never at one stream, whose drafted steps show the fit a row's cost)."""
        return decoding in self.quiet

    def _drafts_lost(self, decoding: int) -> bool:
        drafted, plain = self.drafted.get(decoding), self.plain.get(decoding)
        return (drafted is not None and plain is not None and min(drafted.steps, plain.steps) >= PAYOFF_MIN_STEPS
                and drafted.per_second < plain.per_second)
