"""Jump-forward: where the grammar admits a single continuation, its tokens are appended unsampled.

They are the model's own tokenization of the forced text, fed as one chunk of the next step with
logits on its last row only: no step of their own and no output projection over the vocabulary.
The tokenization's last token is left to sampling unless the text finishes the document, since it
could merge with what the model writes next (`":"` then `"` tokenizes as `":` + `""`); once it is
all that is left, it is appended too where nothing the grammar allows next can merge with it.
"""
from __future__ import annotations

from typing import Callable, Sequence as Seq

import numpy as np

from engine.text import exact_spelling
from sampling.grammar.matcher import GrammarMatcher

_CACHE_LIMIT = 4096


class JumpForward:
    def __init__(self, tokenize: Callable[[str], list[int]], token_bytes: Seq[bytes], max_bytes: int = 64) -> None:
        self._tokenize = tokenize
        self._token_bytes = token_bytes
        self._max_bytes = max_bytes
        self._tokens: dict[tuple[bytes, bool], tuple[int, ...]] = {}
        self._alone: dict[tuple[bytes, frozenset[int]], bool] = {}

    def forced_tokens(self, matcher: GrammarMatcher) -> tuple[int, ...]:
        """Tokens the grammar forces next, in the model's canonical tokenization."""
        data, finishes = matcher.forced_bytes(self._max_bytes)
        whole = _whole_characters(data)
        if not whole:
            return ()
        key = (whole, finishes and whole == data)
        tokens = self._tokens.get(key)
        if tokens is None:
            tokens = self._tokenized(*key)
            if len(self._tokens) >= _CACHE_LIMIT:
                self._tokens.clear()
            self._tokens[key] = tokens
        if not tokens and not key[1]:
            # The text is one token, held back in case it merges with what follows; appended
            # where nothing that may follow can merge with it.
            token = self.token_spelling(whole)
            if token is not None and self._stands_alone(matcher, whole, token):
                return (token,)
        return tokens

    def forced_positions(self, matcher: GrammarMatcher, tokens: Seq[int]) -> tuple[bool, ...]:
        """For tokens to follow the matcher's state (the grammar allowing each): which of them
        jump-forward would append itself, unsampled, once the ones before them are in. The
        first never is: what the grammar forced before it was appended already. The matcher
        is left as it was."""
        if not tokens:
            return ()
        matcher = matcher.fork()
        matcher.advance(tokens[0])
        forced, run = [False], ()
        for token in tokens[1:]:
            run = run or self.forced_tokens(matcher)
            forced.append(bool(run) and run[0] == token)
            run = run[1:] if forced[-1] else ()
            matcher.advance(token)
        return tuple(forced)

    def _stands_alone(self, matcher: GrammarMatcher, text: bytes, token: int) -> bool:
        """No token the grammar allows here runs past `text`, and the model spells `text` followed
        by any byte the grammar allows after it with `token` first (one byte of lookahead: `":"`
        before `"` is `":` + `""`)."""
        allowed = np.flatnonzero(matcher.allowed_mask())
        if allowed.size > 64 or not all(text.startswith(self._token_bytes[t]) for t in allowed.tolist()):
            return False
        after = matcher.next_bytes_after(text)
        key = (text, after)
        alone = self._alone.get(key)
        if alone is None:
            # a byte from 0x80 up begins a character this check cannot spell alone: not proven
            alone = all(b < 0x80 and self._tokenize((text + bytes([b])).decode("utf-8"))[:1] == [token]
                        for b in after)
            if len(self._alone) >= _CACHE_LIMIT:
                self._alone.clear()
            self._alone[key] = alone
        return alone

    def token_spelling(self, text: bytes) -> int | None:
        """The model's one token for `text`, if its tokenization is a single token spelling it."""
        try:
            tokens = self._tokenize(text.decode("utf-8"))
        except UnicodeDecodeError:
            return None
        return tokens[0] if len(tokens) == 1 and self._token_bytes[tokens[0]] == text else None

    def _tokenized(self, data: bytes, finishes: bool) -> tuple[int, ...]:
        tokens = self._tokenize(data.decode("utf-8"))
        if not finishes:
            tokens = tokens[:-1]
        return exact_spelling(tokens, data, self._token_bytes)  # what the grammar checked


def _whole_characters(data: bytes) -> bytes:
    """`data` without a trailing incomplete UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead < 0x80:
            return data  # ASCII: everything before it is whole too
        if lead >= 0xC0:  # the lead byte of the last character
            need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data
