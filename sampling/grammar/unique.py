"""Arrays of distinct strings (`uniqueItems` over strings of any content): the automaton admits
any strings there; this guard, one per matcher, keeps them distinct.

Such an array is a rule of its own (schema.py), so a parse is inside one when its top state is
one of that rule's. The array holds only strings, so its items are the strings completed since
the last '[' outside a string. A parse inside the array that completes a string equal (as JSON)
to an earlier item is dropped, and a token that leaves no parse is not allowed.

The budget stays kept: once the array has an item, a token that leaves a parse inside it needs
one token to spare (remaining - 1 >= U + 1), unless it stops right after a string or at a
character boundary of a string that would be a new item if closed there. From such a place the
string can close; from any other there is a token to spare for a character making it new (a
single-byte token: there are far more of those than items so far). So a mask is never left
empty and the document still completes within the budget.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .frames import U16_INF
from .vocab_index import VocabIndex

if TYPE_CHECKING:
    from .compiled import CompiledGrammar, StateSet

_QUOTE, _BACKSLASH, _OPEN = 0x22, 0x5C, 0x5B


@dataclass(frozen=True)
class Lexer:
    """Where the bytes so far stand, as far as strings and arrays go."""
    in_string: bool = False
    escape: bool = False          # the last byte was a backslash inside a string
    raw: bytes = b""              # the current string's bytes so far (escapes as written)
    items: tuple[str, ...] = ()   # strings completed since the last '[' outside a string
    after_string: bool = False    # the last byte closed a string


@dataclass
class _Tables:
    quotes: np.ndarray            # int per token: number of '"' bytes
    plain: np.ndarray             # bool: no backslash and whole UTF-8 characters
    by_text: dict[bytes, list[int]]
    entering: np.ndarray          # bool: a '[' and enough quotes to complete two strings


_TABLES: dict[int, tuple[VocabIndex, _Tables]] = {}
_LOCK = threading.Lock()


def _tables(idx: VocabIndex) -> _Tables:
    with _LOCK:
        hit = _TABLES.get(id(idx))
        if hit is not None and hit[0] is idx:
            return hit[1]
    toks = idx.token_bytes
    quotes = np.array([t.count(b'"') for t in toks], dtype=np.int64)
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
    entering = np.array([b"[" in t for t in toks]) & (quotes >= 4)
    tables = _Tables(quotes, plain, by_text, entering)
    with _LOCK:
        _TABLES[id(idx)] = (idx, tables)
    return tables


def inside(g: CompiledGrammar, S: StateSet) -> bool:
    """Some parse stands inside an array of distinct strings."""
    unique, n = g.unique_states, g.n_states
    return any(unique[c[-1] % n] for c in S)


def feed(g: CompiledGrammar, S: StateSet, lex: Lexer, data: bytes) -> tuple[StateSet, Lexer]:
    """Run `data` from S, dropping the parses inside an array that repeat one of its strings;
    an empty state set when no parse is left."""
    in_string, escape, raw, items, after = lex.in_string, lex.escape, lex.raw, lex.items, lex.after_string
    unique, n = g.unique_states, g.n_states
    for b in data:
        after = False
        if in_string:
            if escape:
                escape = False
            elif b == _BACKSLASH:
                escape = True
            elif b == _QUOTE:
                S = g.step(S, b)
                value = json.loads(b'"' + raw + b'"')
                if value in items:
                    S = frozenset(c for c in S if not unique[c[-1] % n])
                else:
                    items = items + (value,)
                if not S:
                    break
                in_string, raw, after = False, b"", True
                continue
            raw += bytes((b,))
        elif b == _QUOTE:
            in_string, escape, raw = True, False, b""
        elif b == _OPEN:
            items = ()
        S = g.step(S, b)
        if not S:
            break
    return S, Lexer(in_string, escape, raw, items, after)


def _needs_spare(g: CompiledGrammar, S: StateSet, lex: Lexer) -> bool:
    """A parse inside an array with items, not right after a string nor at a boundary of a
    string that would be new if closed: it must keep a token in hand."""
    if not lex.items or lex.after_string or not inside(g, S):
        return False
    if lex.in_string and not lex.escape:
        try:
            return json.loads(b'"' + lex.raw + b'"') in lex.items
        except ValueError:      # in the middle of a character or an escape
            return True
    return True


def allows(g: CompiledGrammar, S: StateSet, lex: Lexer, token: int, remaining: int | None) -> bool:
    """The guard's verdict on one token the automaton allows within the budget."""
    S2, lex2 = feed(g, S, lex, g.idx.token_bytes[token])
    if not S2:
        return False
    if remaining is None:
        return True
    d = g.distance(S2)
    return d <= remaining - 2 or (d <= remaining - 1 and not _needs_spare(g, S2, lex2))


def mask(g: CompiledGrammar, S: StateSet, lex: Lexer, base: np.ndarray, remaining: int | None) -> np.ndarray:
    """`base` (the automaton's mask within the budget) less what the guard refuses."""
    t = _tables(g.idx)
    out = base.copy()
    if not inside(g, S):
        for tok in np.flatnonzero(out & t.entering).tolist():
            out[tok] = allows(g, S, lex, tok, remaining)
        return out
    tight = np.zeros_like(out)
    if remaining is not None and lex.items:
        best = g.best(S)
        tight = out & (best.astype(np.int64) >= remaining - 1) & (best != U16_INF)
    check = out & ((t.quotes > 0) | (tight & ~t.plain))
    if not lex.in_string or lex.escape:
        check |= tight          # few tokens there; in a string the plain ones are vectorised
    elif tight.any():
        # Tight plain tokens staying in the string: refused where the string would then be an
        # earlier item (closing there would repeat it; nothing spare to make it new).
        try:
            prefix = json.loads(b'"' + lex.raw + b'"')
        except ValueError:
            check |= tight
        else:
            repeat = np.zeros_like(out)
            for item in lex.items:
                if item.startswith(prefix):
                    repeat[t.by_text.get(item[len(prefix):].encode("utf-8"), [])] = True
            out &= ~(tight & (t.quotes == 0) & t.plain & repeat)
    for tok in np.flatnonzero(check).tolist():
        out[tok] = allows(g, S, lex, tok, remaining)
    return out
