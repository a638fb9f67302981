"""GrammarMatcher: one request's position in a compiled grammar."""
from __future__ import annotations

import copy

import numpy as np

from . import distance, unique
from .frames import U16_INF
from .pushdown import Pushdown, StateSet

INF = int(distance.INF)


class GrammarMatcher:
    """Tracks the bytes generated so far; cheap to create (all tables live in the grammar)."""

    def __init__(self, grammar: Pushdown) -> None:
        self._g = grammar
        self._S: StateSet = grammar.start
        self._ended = False           # an EOG token was accepted
        # Arrays whose items are kept distinct (unique.py): where the bytes stand, the last mask.
        self._lexer = unique.Lexer() if grammar.unique_states is not None else None
        self._guarded: tuple[object, np.ndarray] | None = None

    # ------------------------------------------------------------ queries
    @property
    def json_document(self) -> bool:
        """The output is one JSON document (not tool calls in a model's own syntax)."""
        return self._g.json_document

    @property
    def is_complete(self) -> bool:
        """The bytes so far form a complete valid document (EOG is allowed)."""
        return self._ended or self._g.is_complete(self._S)

    @property
    def is_finished(self) -> bool:
        """Complete, and no further byte could extend the document: the engine may stop."""
        return self._ended or self._g.is_finished(self._S)

    def min_tokens_to_complete(self) -> int:
        """Tokens within which the document can certainly be completed (0 when complete).

        This is the distance the budget logic uses: exact over the budget token set, hence an
        upper bound on the true minimum (see distance.py); for small vocabularies and
        non-recursive schemas it is the exact minimum."""
        return 0 if self._ended else self._g.distance(self._S)

    def allowed_mask(self, remaining_tokens: int | None = None) -> np.ndarray:
        """bool[vocab], read-only: tokens allowed next. EOG only when complete. With `remaining_tokens`,
        only tokens after which the document can still be completed in remaining_tokens - 1
        tokens; if no token meets the budget (the caller gave less than
        min_tokens_to_complete()), the tokens getting closest to completion are allowed."""
        if self._lexer is None:
            return self._automaton_mask(remaining_tokens)
        key = (self._S, self._lexer, remaining_tokens)
        if self._guarded is None or self._guarded[0] != key:
            mask = unique.mask(self._g, self._S, self._lexer, self._automaton_mask(remaining_tokens), remaining_tokens)
            mask.flags.writeable = False
            self._guarded = (key, mask)
        return self._guarded[1]

    def _automaton_mask(self, remaining_tokens: int | None) -> np.ndarray:
        g = self._g
        if self._ended:
            return np.zeros(g.idx.size, dtype=bool)
        shared, longest = g.unbudgeted_mask(self._S)
        if remaining_tokens is None or remaining_tokens - 1 >= longest:
            return shared  # the budget excludes nothing: the cached, read-only mask
        best = g.best(self._S)
        mask = best <= max(min(remaining_tokens - 1, int(U16_INF) - 1), -1)
        if not mask.any() and not self.is_complete:
            mask = best == best.min()
            if best.min() == U16_INF:
                mask[:] = False
        if g.is_complete(self._S):
            mask[g.idx.eog] = True
        return mask

    def is_allowed(self, token: int, remaining_tokens: int | None = None) -> bool:
        """Whether `token` is allowed next; agrees exactly with allowed_mask(remaining_tokens)."""
        g = self._g
        if self._ended or not 0 <= token < g.idx.size:
            return False
        if token in g.idx.eog_set:
            return g.is_complete(self._S)
        if self._lexer is not None:
            return bool(self.allowed_mask(remaining_tokens)[token])
        d = g.token_distance(self._S, token)
        if remaining_tokens is None:
            return d < INF
        if d <= remaining_tokens - 1:
            return True
        if d >= INF or self.is_complete:
            return False
        return bool(self.allowed_mask(remaining_tokens)[token])   # the rare over-budget fallback

    def only_text(self, remaining_tokens: int) -> bytes | None:
        """The text of the next token when the budget allows tokens of one text only (the
        document must close along a single path; a byte may have two tokens: its own and its
        byte-fallback one), else None. Only a tight budget is looked at: without one, a single
        continuation is forced_bytes' business."""
        if self._ended or remaining_tokens - 1 >= self._g.unbudgeted_mask(self._S)[1]:
            return None
        allowed = np.flatnonzero(self.allowed_mask(remaining_tokens))
        if not 0 < allowed.size <= 4:
            return None
        texts = {self._g.idx.token_bytes[t] for t in allowed.tolist()}
        return texts.pop() if len(texts) == 1 else None

    def next_bytes_after(self, data: bytes) -> frozenset[int]:
        """The bytes that may follow `data` from here (a superset: length bounds and distinct
        items aside); the state is unchanged."""
        return frozenset() if self._ended else self._g.next_bytes(self._g.run(self._S, data))

    def forced_bytes(self, limit: int = 64) -> tuple[bytes, bool]:
        """(the next bytes the grammar allows as the only continuation, b"" when there is a
        choice or the document may end here; whether those bytes finish the document)."""
        return (b"", False) if self._ended else self._g.forced_bytes(self._S, limit)

    def fork(self) -> "GrammarMatcher":
        """An independent matcher at the same position (to try tokens ahead without moving this
        one): every update replaces the state rather than editing it, so a shallow copy is one."""
        return copy.copy(self)

    # ------------------------------------------------------------ updates
    def advance(self, token: int) -> None:
        """Consume `token`; ValueError if it is not allowed (state unchanged then)."""
        g = self._g
        if self._ended:
            raise ValueError("the document has already ended (EOG was accepted)")
        if not 0 <= token < g.idx.size:
            raise ValueError(f"token {token} is outside the vocabulary")
        if token in g.idx.eog_set:
            if not g.is_complete(self._S):
                raise ValueError(f"end-of-generation token {token} before the document is complete")
            self._ended = True
            return
        if g.idx.excluded[token]:
            raise ValueError(f"token {token} is a special token and never allowed here")
        if not self._run(g.idx.token_bytes[token]):
            raise ValueError(f"token {token} ({g.idx.token_bytes[token]!r}) is not allowed here")

    def advance_bytes(self, data: bytes) -> None:
        """Consume raw bytes (e.g. a forced prefix); ValueError if they are not allowed."""
        if not self._run(data):
            raise ValueError(f"bytes {data!r} are not allowed here")

    def _run(self, data: bytes) -> bool:
        if self._lexer is None:
            S, lexer = self._g.run(self._S, data), None
        else:
            S, lexer = unique.feed(self._g, self._S, self._lexer, data)
        if not S:
            return False
        self._S, self._lexer = S, lexer
        return True
