"""Turning token bytes into text safely: no split characters, no leaked stop strings; and text
into the tokens that spell it exactly."""
from __future__ import annotations

import codecs
from typing import Sequence as Seq


def exact_spelling(tokens: Seq[int], text: bytes, token_bytes: Seq[bytes]) -> tuple[int, ...]:
    """The leading `tokens` that spell the start of `text` byte for byte (a tokenizer may add a
    leading space or normalise): what the model is fed must be what was checked."""
    kept, at = [], 0
    for t in tokens:
        piece = token_bytes[t]
        if not piece or text[at:at + len(piece)] != piece:
            break
        kept.append(t)
        at += len(piece)
    return tuple(kept)


class IncrementalDetokenizer:
    """Decodes a token stream to text, holding back the bytes of an incomplete UTF-8 character."""

    def __init__(self, token_bytes: tuple[bytes, ...]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._token_bytes[token])

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class StopStringFilter:
    """Finds stop strings in generated text, even when split across tokens.

    Text that might be the start of a stop string is held back from the stream until it is
    clear either way, so a client never sees part of a stop string.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._longest = max((len(s) for s in stops), default=0)
        self.text = ""
        self._emitted = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, new_text: str) -> str:
        """Adds text and returns the part that is now safe to stream."""
        if self.stopped:
            return ""
        self.text += new_text
        if not self._stops:
            return self._emit(len(self.text))
        search_from = max(0, self._emitted - self._longest + 1)
        hits = [(i, s) for s in self._stops if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])  # the earliest; on a tie, the first listed
            self.text = self.text[:at]
            self.stopped = True
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._held_back())

    def flush(self) -> str:
        """At the end of generation: release what was held back as a possible stop prefix."""
        return self._emit(len(self.text))

    def _held_back(self) -> int:
        for k in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0

    def _emit(self, upto: int) -> str:
        upto = max(upto, self._emitted)
        chunk = self.text[self._emitted : upto]
        self._emitted = upto
        return chunk
