"""`uniqueItems` over items the automaton cannot keep distinct: the automaton admits any items
there; this guard, one per matcher, keeps them distinct.

Such an array is a rule of its own (schema.py): a parse is inside one when a state of that rule
is on its stack, and an array opened by a parse entering such a rule is guarded. The guard follows the bytes (strings, brackets, the items of
every open array); when an item of a guarded innermost array ends (its closing quote for a
string, else the ',' or ']' after it) and equals an earlier item as JSON, the parses inside the
array are dropped, and a token that leaves no parse is not allowed.

Two kinds of guarded array:
- strings of any content ("free"): generated with any number of items. Once the array has an
  item, a token that leaves a parse inside it needs one token to spare (remaining - 1 >= U + 1)
  unless it stops right after a string or at a character boundary of a string that would be a
  new item if closed there. From such a place the string can close; from any other there is a
  token to spare for a character making it new (a single-byte token: there are far more of
  those than items so far). So a mask is never left empty and the budget still closes the
  document.
- any other items ("read"): documents with distinct items are accepted (reading a document, the
  dataset walks), but generation writes at most one item there, where no distinct item could be
  out of reach.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .frames import U16_INF
from .keywords import value_key
from .pushdown import Pushdown, StateSet
from .vocab_index import VocabIndex

FREE, READ = 1, 2       # kinds of guarded array state (Pushdown.unique_states)
_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPENS, _WHITESPACE = frozenset(b"[{"), frozenset(b" \t\r\n")


@dataclass(frozen=True)
class Lexer:
    """Where the bytes so far stand: strings, open containers and their items."""
    text: bytes = b""
    in_string: bool = False
    escape: bool = False          # the last byte was a backslash inside a string
    string_start: int = 0         # offset of the current (or last) string's opening quote
    # Open containers, innermost last: (b"[" or b"{", offset where the current item starts,
    # keys of the items so far, whether the current item was already counted, guarded).
    open: tuple[tuple[int, int, tuple[str, ...], bool, bool], ...] = ()
    after_string: bool = False    # the last byte closed a string

    def items(self) -> tuple[str, ...]:
        """Keys of the items of the innermost container, when it is a guarded array."""
        return self.open[-1][2] if self.open and self.open[-1][4] else ()


@dataclass
class _Tables:
    quotes: np.ndarray            # int per token: number of '"' bytes
    commas: np.ndarray            # bool: a ',' byte
    plain: np.ndarray             # bool: no backslash and whole UTF-8 characters
    by_text: dict[bytes, list[int]]
    entering: np.ndarray          # bool: a '[' and enough to end an item inside the token


def _tables(idx: VocabIndex) -> _Tables:
    return idx.derived("unique", lambda: _build_tables(idx))


def _build_tables(idx: VocabIndex) -> _Tables:
    toks = idx.token_bytes
    quotes = np.array([t.count(b'"') for t in toks], dtype=np.int64)
    commas = np.array([b"," in t for t in toks])
    plain = np.zeros(len(toks), dtype=bool)
    by_text: dict[bytes, list[int]] = {}
    for i, t in enumerate(toks):
        if idx.excluded[i] or b"\\" in t:
            continue
        try:
            t.decode("utf-8")
        except UnicodeDecodeError:
            continue
        plain[i] = True
        by_text.setdefault(t, []).append(i)
    entering = np.array([b"[" in t for t in toks]) & ((quotes >= 2) | commas)
    return _Tables(quotes, commas, plain, by_text, entering)


def _kind(g: Pushdown, config: tuple) -> int:
    """The kind of the innermost guarded array the parse stands in (0: none); its items may be
    rules it called."""
    unique, n = g.unique_states, g.n_states
    for x in reversed(config):
        if unique[x % n]:
            return unique[x % n]
    return 0


def inside(g: Pushdown, S: StateSet, kind: int) -> bool:
    """Some parse stands inside a guarded array of this kind."""
    return any(_kind(g, c) == kind for c in S)


def _drop(g: Pushdown, S: StateSet, kinds: tuple[int, ...]) -> StateSet:
    return frozenset(c for c in S if _kind(g, c) not in kinds)


def feed(g: Pushdown, S: StateSet, lex: Lexer, data: bytes, generating: bool = False) -> tuple[StateSet, Lexer]:
    """Run `data` from S, dropping the parses inside a guarded array that repeat one of its
    items (and, `generating`, those starting a second item of a READ array); an empty state set
    when no parse is left."""
    text, in_string, escape, string_start = lex.text, lex.in_string, lex.escape, lex.string_start
    frames, after = list(lex.open), lex.after_string
    pos = len(text)
    text += data
    for b in data:
        closing = opening = after = False
        if in_string:
            if escape:
                escape = False
            elif b == _BACKSLASH:
                escape = True
            elif b == _QUOTE:
                in_string, closing, after = False, True, True
        elif b == _QUOTE:
            in_string, escape, string_start = True, False, pos
        elif b in _OPENS:
            opening = True
        elif b in b",]}" and frames:
            # A non-string item ends before its separator is consumed.
            bracket, start, items, counted, guarded = frames[-1]
            if guarded and not counted and text[start:pos].strip():
                S = _item_end(g, S, frames, text[start:pos])
            if b == 0x2C:
                if generating and guarded:
                    S = _drop(g, S, (READ,))      # generation writes one item there
                frames[-1] = (bracket, pos + 1, frames[-1][2], False, guarded)
            else:
                frames.pop()
        S = g.step(S, b)
        if S and closing and frames and frames[-1][4] and not text[frames[-1][1]:string_start].strip():
            S = _item_end(g, S, frames, text[string_start:pos + 1])   # a string item ends at its quote
        elif S and opening:
            guarded = b == 0x5B and any(c[-1] % g.n_states in g.unique_open for c in S)
            frames.append((b, pos + 1, (), False, guarded))
        if not S:
            break
        pos += 1
    return S, Lexer(text, in_string, escape, string_start, tuple(frames), after)


def _item_end(g: Pushdown, S: StateSet, frames: list, item: bytes) -> StateSet:
    """The innermost array's current item is `item`: drop the guarded parses if it repeats."""
    bracket, start, items, _, guarded = frames[-1]
    try:
        key = value_key(json.loads(item))
    except ValueError:      # not a whole value: the next step refuses it
        return S
    if key in items:
        return _drop(g, S, (FREE, READ))
    frames[-1] = (bracket, start, items + (key,), True, guarded)
    return S


def _string_so_far(lex: Lexer) -> str | None:
    """The current string's value if it closed here; None inside a character or an escape."""
    try:
        return json.loads(lex.text[lex.string_start:] + b'"')
    except ValueError:
        return None


def _needs_spare(g: Pushdown, S: StateSet, lex: Lexer) -> bool:
    """A parse inside a FREE array with items, not right after a string nor at a boundary of a
    string that would be new if closed: it must keep a token in hand."""
    items = lex.items()
    if not items or lex.after_string or not inside(g, S, FREE):
        return False
    if lex.in_string and not lex.escape:
        value = _string_so_far(lex)
        return value is None or value_key(value) in items
    return True


def allows(g: Pushdown, S: StateSet, lex: Lexer, token: int, remaining: int | None) -> bool:
    """The guard's verdict on one token the automaton allows within the budget."""
    S2, lex2 = feed(g, S, lex, g.idx.token_bytes[token], generating=True)
    if not S2:
        return False
    if remaining is None:
        return True
    d = g.distance(S2)
    return d <= remaining - 2 or (d <= remaining - 1 and not _needs_spare(g, S2, lex2))


def mask(g: Pushdown, S: StateSet, lex: Lexer, base: np.ndarray, remaining: int | None) -> np.ndarray:
    """`base` (the automaton's mask within the budget) less what the guard refuses."""
    t = _tables(g.idx)
    out = base.copy()
    free, read = inside(g, S, FREE), inside(g, S, READ)
    if not (free or read):
        check = out & t.entering
    elif lex.in_string:
        check = out & (t.quotes > 0)     # a ',' ends an item only once the string is closed
    else:
        check = out & ((t.quotes > 0) | t.commas)
    if free and remaining is not None and lex.items():
        best = g.best(S)
        tight = out & (best.astype(np.int64) >= remaining - 1) & (best != U16_INF)
        check |= tight & ~t.plain
        value = _string_so_far(lex) if lex.in_string and not lex.escape else None
        if value is None:
            check |= tight          # few tokens outside a string; rare inside a character
        elif tight.any():
            # Tight plain tokens staying in the string: refused where the string would then be
            # an earlier item (closing there would repeat it; nothing spare to make it new).
            repeat = np.zeros_like(out)
            for item in lex.items():
                item = json.loads(item)
                if isinstance(item, str) and item.startswith(value):
                    repeat[t.by_text.get(item[len(value):].encode("utf-8"), [])] = True
            out &= ~(tight & (t.quotes == 0) & t.plain & repeat)
    for tok in np.flatnonzero(check).tolist():
        out[tok] = allows(g, S, lex, tok, remaining)
    return out
