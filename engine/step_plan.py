"""What one step feeds llama_decode: the scheduler writes it, the policy and the runner read it."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.drafts import Draft
from engine.sequence import Sequence


@dataclass(frozen=True)
class Chunk:
    seq: Sequence
    start: int  # index into seq.tokens, equal to the KV position of its first token
    length: int  # tokens of seq.tokens it feeds
    # Tokens guessed to follow seq.tokens (engine/drafts.py), fed after them with logits on
    # their rows (but `forced` ones'): the model verifies them in this step (engine/verify.py).
    draft: tuple[int, ...] = ()
    granted: Draft | None = None  # the proposal `draft` was cut from (its source and match): learned from
    # Per drafted token: the grammar forces it there (jump-forward would append it unsampled), so
    # the row before it needs no logits and it is kept once the tokens before it are.
    forced: tuple[bool, ...] = ()

    @property
    def logit_rows(self) -> list[int]:
        """Which of its last 1 + len(draft) rows (0: the sampling row) have logits: every row but
        those whose next token is forced."""
        forced = self.forced or (False,) * len(self.draft)
        return [j for j in range(len(self.draft) + 1) if j == len(self.draft) or not forced[j]]

    @property
    def n_rows(self) -> int:
        return self.length + len(self.draft)

    @property
    def wants_logits(self) -> bool:
        """Its last row samples the next token (a scoring-only request, max_tokens 0, never samples)."""
        return self.start + self.length == len(self.seq.tokens) and self.seq.request.max_tokens > 0


@dataclass
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    interruptible: bool = False  # an arriving interactive request may abort this step
    prompt_tokens: int = 0  # prompt (and recomputed) tokens among its chunks

    @property
    def n_tokens(self) -> int:
        return sum(c.n_rows for c in self.chunks)

    @property
    def decode_only(self) -> bool:
        """No prompt chunk: every chunk is a decoding sequence's next row (and its draft)."""
        return all(c.seq.is_decoding for c in self.chunks)
