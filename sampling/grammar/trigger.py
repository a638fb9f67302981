"""A grammar that applies only if the output begins like its document: free text otherwise.

Tool calling's `auto` choice: the model may answer in words or call functions. The first token
decides. A token whose first byte can start the document (for the calls grammar, `{`) commits
the output to the grammar, budget rules and all; any other token commits it to free text, and
the matcher is `released` (the engine then drops it: the rest is raw generation). The first
token may begin a document only while the remaining budget can still complete one, so a call
that is started is always finished in time. A model whose calls open with a special token (no
text: Mistral's `[TOOL_CALLS]`) may open the document with that token too; the grammar then
starts after it.

A family whose template writes text before its calls (Qwen's `Sure.\n<tool_call>...`) passes
`after_text`: text then stays watched, and where it first holds the calls' `marker` (or the
opening special token), the grammar takes over from the marker's first byte, the text before it
being the answer's content. A token that would complete the marker is allowed only if what
follows the marker in it begins a document the budget can still finish (marker_watch.py).
"""
from __future__ import annotations

import copy

import numpy as np

from .marker_watch import MarkerWatch
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

    def __init__(self, inner: GrammarMatcher, opening_token: int | None = None, *,
                 after_text: bool = False, marker: bytes = b"") -> None:
        self._inner = inner
        self._opening_token = opening_token
        idx: VocabIndex = inner._g.idx
        self._after_text = after_text
        # Watched for in text: the opening token, else the marker (a prefix of the document).
        self._watch = MarkerWatch(marker, idx) if after_text and opening_token is None else None
        self._marker_state = 0
        self._opened_by: dict[bytes, int | None] = {}  # after the marker: tokens to finish, None: refused
        self._all = idx.derived("all_tokens", lambda: _read_only(np.ones(idx.size, dtype=bool)))
        self._masks: dict[tuple[int, ...], np.ndarray] = {}
        self._opening = inner.next_bytes_after(b"")
        first = idx.derived("first_bytes", lambda: first_bytes(idx))
        key = ("opens_document", self._opening)
        opens = idx.derived(key, lambda: np.isin(first, np.fromiter(self._opening, dtype=np.int16)))
        self._opens = opens  # bool per token: committing it starts the document
        # A token with no text (a control token) decides nothing: the reader of the output sees
        # only text, and must see the same decision as the grammar.
        self._textless = idx.derived("textless", lambda: first < 0)
        self._needed = inner.min_tokens_to_complete()
        self.mode = "undecided"  # then "document", "text" (released) or "prose" (text, watched)

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

    def _may_open_after_text(self, token: int, remaining_tokens: int | None) -> bool:
        """Prose: whether `token` may be written (True unless it would open calls that cannot be)."""
        if token == self._opening_token:
            return self._may_open(remaining_tokens)
        if self._watch is None:
            return True
        rest = self._watch.completing[self._marker_state].get(token)
        if rest is None:
            return True
        needed = self._opened_by.get(rest, -1)
        if needed == -1:
            twin = self._inner.fork()
            try:
                twin.advance_bytes(self._watch.marker + rest)
                needed = twin.min_tokens_to_complete()
            except ValueError:
                needed = None
            self._opened_by[rest] = needed
        return needed is not None and (remaining_tokens is None or needed <= remaining_tokens - 1)

    def _prose_mask(self, remaining_tokens: int | None) -> np.ndarray:
        candidates = [] if self._watch is None else list(self._watch.completing[self._marker_state])
        if self._opening_token is not None:
            candidates.append(self._opening_token)
        refused = tuple(t for t in candidates if not self._may_open_after_text(t, remaining_tokens))
        if not refused:
            return self._all
        mask = self._masks.get(refused)
        if mask is None:  # the same object for the same refusals: the sampler caches per mask
            mask = np.ones(self._opens.size, dtype=bool)
            mask[list(refused)] = False
            self._masks[refused] = _read_only(mask)
        return mask

    def allowed_mask(self, remaining_tokens: int | None = None) -> np.ndarray:
        if self.mode == "document":
            return self._inner.allowed_mask(remaining_tokens)
        if self.mode == "text":
            return self._all
        if self.mode == "prose":
            return self._prose_mask(remaining_tokens)
        mask = ~self._opens
        if self._may_open(remaining_tokens):
            mask |= self._inner.allowed_mask(remaining_tokens)
        elif self._opening_token is not None:
            mask[self._opening_token] = False
        if self._watch is not None:  # text that holds the whole marker already
            mask &= self._prose_mask(remaining_tokens)
        return mask

    def is_allowed(self, token: int, remaining_tokens: int | None = None) -> bool:
        if self.mode == "document":
            return self._inner.is_allowed(token, remaining_tokens)
        if not 0 <= token < self._opens.size:
            return False
        if self.mode == "text":
            return True
        if self.mode == "prose":
            return self._may_open_after_text(token, remaining_tokens)
        if token == self._opening_token:
            return self._may_open(remaining_tokens)
        if not self._opens[token]:
            return self._watch is None or self._may_open_after_text(token, remaining_tokens)
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
        twin._masks = {}
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
                self._to_text(self._inner._g.idx.token_bytes[token])
            return
        if self.mode == "prose":
            if token == self._opening_token:
                self.mode = "document"
            elif 0 <= token < self._textless.size and not self._textless[token]:
                self._watch_text(self._inner._g.idx.token_bytes[token])
            return
        if self.mode == "document":
            self._inner.advance(token)

    def advance_bytes(self, data: bytes) -> None:
        if self.mode == "undecided":
            if data and data[0] in self._opening:
                self._inner.advance_bytes(data)
                self.mode = "document"
            elif data:
                self._to_text(data)
            return
        if self.mode == "prose":
            self._watch_text(data)
            return
        if self.mode == "document":
            self._inner.advance_bytes(data)

    def _to_text(self, data: bytes) -> None:
        if not self._after_text:
            self.mode = "text"
            return
        self.mode = "prose"
        self._watch_text(data)

    def _watch_text(self, data: bytes) -> None:
        if self._watch is None:
            return
        state, end = self._watch.run(self._marker_state, data)
        if end is None:
            self._marker_state = state
            return
        # Checked before it was allowed (is_allowed): raises only for bytes forced past the check.
        self._inner.advance_bytes(self._watch.marker + data[end:])
        self.mode = "document"
        self._masks = {}


def _read_only(mask: np.ndarray) -> np.ndarray:
    mask.flags.writeable = False
    return mask
