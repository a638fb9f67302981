"""Drafts for structured answers: the word being written, completed from a word of the prompt.

An extraction ("the person as JSON") copies names, places and numbers from its prompt, but in
other tokens: the prompt's ` Krakow` is one token after a space, while the answer's `"Krakow`,
a word opening a JSON string, is `"`, `K`, `rak`, `ow`. So no token n-gram of the answer occurs in
the prompt; yet once `K` is written, the prompt's one word that begins with `K` says what follows.
Its rest is tokenized as the model spells it alone, and verified like any draft.

A prefix that is a whole word of the prompt, or begins words that go on differently, proposes
nothing: the word may be done, or which one it is is a guess.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Callable, Sequence as Seq

from engine.text import exact_spelling
from engine.tuning import DRAFT_MATCH_CAP, PROMPT_WORDS_MAX_REST, PROMPT_WORDS_WINDOW

_WORD = rb"0-9A-Za-z\x80-\xff"  # bytes from 0x80 up: letters of other scripts, in UTF-8
_WORDS = re.compile(rb"[" + _WORD + rb"]+")
_WORD_AT_END = re.compile(rb"[" + _WORD + rb"]+\Z")
_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class WordsOfPrompt:
    """A sequence's prompt as its distinct words, sorted (a prefix's words are then one run found
    by bisection), built once when it first drafts. Owned by its sequence."""

    words: tuple[bytes, ...]
    n_prompt: int


class PromptWords:
    """Engine thread only."""

    def __init__(self, tokenize: Callable[[str], list[int]], token_bytes: Seq[bytes]) -> None:
        self._tokenize = tokenize
        self._token_bytes = token_bytes
        self._spellings: dict[bytes, tuple[int, ...]] = {}

    def of(self, prompt_tokens: Seq[int]) -> WordsOfPrompt:
        text = b"".join(self._token_bytes[t] for t in prompt_tokens)
        return WordsOfPrompt(tuple(sorted(set(_WORDS.findall(text)))), len(prompt_tokens))

    def completion(self, prompt: WordsOfPrompt, tokens: Seq[int], limit: int) -> tuple[tuple[int, ...], int]:
        """The rest of the word the output ends in, as at most `limit` tokens, and the written
        part's length in bytes (the draft's match); ((), 0) where the prompt does not say."""
        start = max(prompt.n_prompt, len(tokens) - PROMPT_WORDS_WINDOW)
        tail = b"".join(self._token_bytes[t] for t in tokens[start:])
        written = _WORD_AT_END.search(tail)
        if written is None or (written.start() == 0 and start > prompt.n_prompt):
            return (), 0  # no word being written, or it began before the window
        prefix, words = written.group(), prompt.words
        first = bisect.bisect_left(words, prefix)
        # The words that begin with the prefix follow one another from `first`: exactly one, and
        # not the prefix itself.
        if (first == len(words) or words[first] == prefix or not words[first].startswith(prefix)
                or (first + 1 < len(words) and words[first + 1].startswith(prefix))):
            return (), 0
        rest = words[first][len(prefix):PROMPT_WORDS_MAX_REST + len(prefix)]
        return self._spelled(rest)[:limit], min(len(prefix), DRAFT_MATCH_CAP)

    def _spelled(self, rest: bytes) -> tuple[int, ...]:
        """The model's tokens for `rest` alone, as far as they spell it exactly."""
        tokens = self._spellings.get(rest)
        if tokens is None:
            try:
                ids = self._tokenize(rest.decode("utf-8"))
            except UnicodeDecodeError:  # the written part ended inside a character
                ids = []
            tokens = exact_spelling(ids, rest, self._token_bytes)
            if len(self._spellings) >= _CACHE_LIMIT:
                self._spellings.clear()
            self._spellings[rest] = tokens
        return tokens
