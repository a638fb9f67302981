"""A grammar that applies only if the output begins like its document: free text otherwise.

Tool calling's `auto` choice: the model may answer in words or call functions. The first token
decides. A token whose first byte can start the document (for the calls grammar, `{`) commits
the output to the grammar, budget rules and all; any other token commits it to free text, and
the matcher is `released` (the engine then drops it: the rest is raw generation). The first
token may begin a document only while the remaining budget can still complete one, so a call
that is started is always finished in time. A model whose calls open with a special token (no
text: Mistral's `[TOOL_CALLS]`) may open the document with that token too; the grammar then
starts after it.
"""
from __future__ import annotations

import copy

import numpy as np

from .matcher import GrammarMatcher
from .vocab_index import VocabIndex


def first_bytes(idx: VocabIndex) -> np.ndarray:
    """int16 per token: its first byte, or -1 for tokens with no bytes of text."""
    first = np.full(idx.size, -1, dtype=np.int16)
    for token, data in enumerate(idx.token_bytes):
        if data:
            first[token] = data[0]
    return first


class TriggeredMatcher:
    """Wraps a document matcher; the engine's sampler and jump-forward see the same interface."""

    def __init__(self, inner: GrammarMatcher, opening_token: int | None = None) -> None:
        self._inner = inner
        self._opening_token = opening_token
        idx: VocabIndex = inner._g.idx
        self._opening = inner.next_bytes_after(b"")
        first = idx.derived("first_bytes", lambda: first_bytes(idx))
        key = ("opens_document", self._opening)
        opens = idx.derived(key, lambda: np.isin(first, np.fromiter(self._opening, dtype=np.int16)))
        self._opens = opens  # bool per token: committing it starts the document
        # A token with no text (a control token) decides nothing: the reader of the output sees
        # only text, and must see the same decision as the grammar.
        self._textless = idx.derived("textless", lambda: first < 0)
        self._needed = inner.min_tokens_to_complete()
        self.mode = "undecided"  # then "document" or "text"

    @property
    def released(self) -> bool:
        """The output is free text: no constraint remains."""
        return self.mode == "text"

    @property
    def in_document(self) -> bool:
        return self.mode == "document"

    @property
    def json_document(self) -> bool:
        return self._inner.json_document

    # ------------------------------------------------------------ queries
    @property
    def is_complete(self) -> bool:
        return self._inner.is_complete if self.mode == "document" else True

    @property
    def is_finished(self) -> bool:
        return self._inner.is_finished if self.mode == "document" else False

    def min_tokens_to_complete(self) -> int:
        return self._inner.min_tokens_to_complete() if self.mode == "document" else 0

    def _may_open(self, remaining_tokens: int | None) -> bool:
        return remaining_tokens is None or remaining_tokens >= self._needed

    def allowed_mask(self, remaining_tokens: int | None = None) -> np.ndarray:
        if self.mode == "document":
            return self._inner.allowed_mask(remaining_tokens)
        if self.mode == "text":
            return np.ones(self._opens.size, dtype=bool)
        mask = ~self._opens
        if self._may_open(remaining_tokens):
            mask |= self._inner.allowed_mask(remaining_tokens)
        elif self._opening_token is not None:
            mask[self._opening_token] = False
        return mask

    def is_allowed(self, token: int, remaining_tokens: int | None = None) -> bool:
        if self.mode == "document":
            return self._inner.is_allowed(token, remaining_tokens)
        if not 0 <= token < self._opens.size:
            return False
        if self.mode == "text":
            return True
        if token == self._opening_token:
            return self._may_open(remaining_tokens)
        if not self._opens[token]:
            return True
        return self._may_open(remaining_tokens) and self._inner.is_allowed(token, remaining_tokens)

    def only_text(self, remaining_tokens: int) -> bytes | None:
        return self._inner.only_text(remaining_tokens) if self.mode == "document" else None

    def next_bytes_after(self, data: bytes) -> frozenset[int]:
        return self._inner.next_bytes_after(data) if self.mode == "document" else frozenset()

    def forced_bytes(self, limit: int = 64) -> tuple[bytes, bool]:
        # Undecided, there is always a choice (text or a document); text forces nothing.
        return self._inner.forced_bytes(limit) if self.mode == "document" else (b"", False)

    def fork(self) -> "TriggeredMatcher":
        """An independent matcher at the same position (GrammarMatcher.fork)."""
        twin = copy.copy(self)
        twin._inner = self._inner.fork()
        return twin

    # ------------------------------------------------------------ updates
    def advance(self, token: int) -> None:
        if self.mode == "undecided":
            if token == self._opening_token:
                self.mode = "document"  # the grammar's bytes begin after it
            elif 0 <= token < self._opens.size and self._opens[token]:
                self._inner.advance(token)  # raises if the grammar does not allow it
                self.mode = "document"
            elif not (0 <= token < self._textless.size and self._textless[token]):
                self.mode = "text"
            return
        if self.mode == "document":
            self._inner.advance(token)

    def advance_bytes(self, data: bytes) -> None:
        if self.mode == "undecided":
            if data and data[0] in self._opening:
                self._inner.advance_bytes(data)
                self.mode = "document"
            elif data:
                self.mode = "text"
            return
        if self.mode == "document":
            self._inner.advance_bytes(data)
