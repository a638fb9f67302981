"""Two grammars as alternatives: the output is a document of the first or of the second.

Tool calling's `auto` beside a JSON output format: the answer either calls functions (the calls
grammar) or is the format's document (its grammar instead of free text). Both matchers follow
the output until one refuses it. Where both could go on, the first wins at its `opening`: once
the output begins with it (the calls document's `{"tool_calls":[`), only the first remains, and
the second may not write a token that completes the opening. So whoever reads the output by
that opening reads it as the grammar made it. A token is allowed only if an alternative that
can still finish within the remaining budget allows it, so the pair keeps each grammar's
guarantee: a complete document within max_tokens.

The first may also open with a special token (`opening_token`, no text: Mistral's
`[TOOL_CALLS]` before its calls in its own syntax, sampling/grammar/framed.py). Its grammar's
bytes then begin after that token, and `opening` is the text that follows it. Allowed as the
first token only (while the first can still finish after it), the token drops the second, as
the opening's text does; the text route stays open as well.
"""
from __future__ import annotations

import copy

import numpy as np

from .matcher import GrammarMatcher
from .trigger import first_bytes
from .vocab_index import VocabIndex


def _completing(idx: VocabIndex, rest: bytes) -> np.ndarray:
    """bool per token: its bytes begin with `rest` (it completes an opening `rest` short)."""
    out = np.zeros(idx.size, dtype=bool)
    first = idx.derived("first_bytes", lambda: first_bytes(idx))
    for token in np.flatnonzero(first == rest[0]).tolist():  # a few hundred of 262k: skip the rest
        out[token] = idx.token_bytes[token].startswith(rest)
    return out


class EitherMatcher:
    """The engine's sampler, jump-forward and speculation see a GrammarMatcher's interface."""

    def __init__(self, first: GrammarMatcher, second: GrammarMatcher, opening: bytes,
                 opening_token: int | None = None) -> None:
        if not opening:
            raise ValueError("the first grammar's opening must not be empty")
        self._first: GrammarMatcher | None = first
        self._second: GrammarMatcher | None = second
        self._idx: VocabIndex = first._g.idx
        self._opening = opening
        self._opening_token = opening_token
        self._seen = b""  # the output so far, while it is still a proper prefix of the opening
        self._deciding = True  # both alive and the output may still become the opening
        self._version = 0  # bumped by every update: keys the cached union mask
        self._cached: tuple[tuple[int, int | None], np.ndarray] | None = None

    # ------------------------------------------------------------ queries
    @property
    def which(self) -> str | None:
        """"first" or "second" once only one alternative remains, else None."""
        if self._second is None:
            return "first"
        return "second" if self._first is None else None

    @property
    def json_document(self) -> bool:
        """The output parses as JSON: every alternative still possible is a JSON document
        (GrammarMatcher.json_document; tool calls in a model's own syntax are not)."""
        return all(m.json_document for m in self._alive())

    def _alive(self) -> list[GrammarMatcher]:
        return [m for m in (self._first, self._second) if m is not None]

    @property
    def is_complete(self) -> bool:
        return any(m.is_complete for m in self._alive())

    @property
    def is_finished(self) -> bool:
        return all(m.is_finished for m in self._alive())

    def min_tokens_to_complete(self) -> int:
        return min(m.min_tokens_to_complete() for m in self._alive())

    def _may_open_by_token(self, remaining: int | None) -> bool:
        """The opening token may come next: nothing written yet, both alive, and the first can
        still finish after it."""
        if self._opening_token is None or self._seen or not self._deciding or self.which is not None:
            return False
        assert self._first is not None
        return remaining is None or self._first.min_tokens_to_complete() <= remaining - 1

    def _usable(self, remaining: int | None) -> list[GrammarMatcher]:
        """The alternatives whose tokens may be sampled: those that can still finish in time
        (when none can, the closest, as a single grammar falls back to its closest tokens)."""
        alive = self._alive()
        if remaining is None:
            return alive
        needs = [m.min_tokens_to_complete() for m in alive]
        fits = [m for m, n in zip(alive, needs) if n <= remaining]
        return fits or [m for m, n in zip(alive, needs) if n == min(needs)]

    def allowed_mask(self, remaining_tokens: int | None = None) -> np.ndarray:
        if self.which is not None:
            return self._alive()[0].allowed_mask(remaining_tokens)
        key = (self._version, remaining_tokens)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        mask = np.zeros(self._idx.size, dtype=bool)
        for m in self._usable(remaining_tokens):
            part = m.allowed_mask(remaining_tokens)
            if m is self._second and self._deciding:
                # Completing the opening is the first's to do, within its own budget.
                part = part & ~self._completes_opening()
            mask |= part
        if not mask.any() and self._first is not None:
            mask = self._first.allowed_mask(remaining_tokens).copy()  # only a forced opening was left
        if self._may_open_by_token(remaining_tokens):
            mask[self._opening_token] = True
        mask.flags.writeable = False
        self._cached = (key, mask)
        return mask

    def _completes_opening(self) -> np.ndarray:
        rest = self._opening[len(self._seen):]
        return self._idx.derived(("completes_opening", rest), lambda: _completing(self._idx, rest))

    def is_allowed(self, token: int, remaining_tokens: int | None = None) -> bool:
        if self.which is not None:
            return self._alive()[0].is_allowed(token, remaining_tokens)
        if token == self._opening_token:
            return self._may_open_by_token(remaining_tokens)
        return 0 <= token < self._idx.size and bool(self.allowed_mask(remaining_tokens)[token])

    def only_text(self, remaining_tokens: int) -> bytes | None:
        # Undecided, None is always safe: the sampler then picks from the mask.
        return self._alive()[0].only_text(remaining_tokens) if self.which is not None else None

    def next_bytes_after(self, data: bytes) -> frozenset[int]:
        return frozenset().union(*(m.next_bytes_after(data) for m in self._alive()))

    def forced_bytes(self, limit: int = 64) -> tuple[bytes, bool]:
        if self.which is not None:
            return self._alive()[0].forced_bytes(limit)
        if self._may_open_by_token(None):
            return b"", False  # the opening token is a choice no forced text may take away
        (a, a_ends), (b, b_ends) = self._first.forced_bytes(limit), self._second.forced_bytes(limit)
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return a[:n], a == b and a_ends and b_ends

    def fork(self) -> "EitherMatcher":
        """An independent matcher at the same position (GrammarMatcher.fork)."""
        twin = copy.copy(self)
        twin._first = None if self._first is None else self._first.fork()
        twin._second = None if self._second is None else self._second.fork()
        return twin

    # ------------------------------------------------------------ updates
    def advance(self, token: int) -> None:
        """Consume `token`; ValueError if no alternative allows it (state unchanged then)."""
        if token in self._idx.eog_set:
            done = [m for m in self._alive() if m.is_complete]
            if not done:
                raise ValueError(f"end-of-generation token {token} before either document is complete")
            self._keep(lambda m: m in done, lambda m: m.advance(token))
            return
        if token == self._opening_token and self.which is None:
            if not self._may_open_by_token(None):
                raise ValueError(f"the opening token {token} may only begin the output")
            self._second, self._deciding = None, False  # the first's bytes begin after it
            self._version += 1
            return
        if not 0 <= token < self._idx.size:
            raise ValueError(f"token {token} is outside the vocabulary")
        self._step(self._idx.token_bytes[token], lambda m: m.advance(token))

    def advance_bytes(self, data: bytes) -> None:
        self._step(data, lambda m: m.advance_bytes(data))

    def _step(self, data: bytes, move) -> None:
        accepted = []
        for m in self._alive():
            try:
                move(m)  # a refused update leaves the matcher as it was
            except ValueError:
                continue
            accepted.append(m)
        if not accepted:
            raise ValueError(f"bytes {data!r} are allowed by neither alternative here")
        self._keep(lambda m: m in accepted, None)
        if self._deciding and self._first is not None and self._second is not None:
            self._seen += data
            if self._seen.startswith(self._opening):
                self._second = None  # the output opened like the first's documents: it is one
            elif not self._opening.startswith(self._seen):
                self._deciding = False
        self._deciding = self._deciding and self._first is not None and self._second is not None

    def _keep(self, keep, move) -> None:
        if self._first is not None and not keep(self._first):
            self._first = None
        if self._second is not None and not keep(self._second):
            self._second = None
        for m in self._alive():
            if move is not None:
                move(m)
        self._version += 1
