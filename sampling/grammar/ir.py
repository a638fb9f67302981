"""A tiny regular-expression IR over bytes, plus calls to other rules (for recursion).

Schema compilation produces IR trees; `nfa.py` turns them into a Thompson NFA. IR nodes are
immutable and may be shared: every use is instantiated afresh by the NFA builder.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from . import utf8


def _hash_once(cls):
    """IR trees are hashed again and again (leaf cache keys, alt() deduplication), and a
    dataclass hash walks the whole tree each time: keep each node's hash once computed."""
    tree_hash = cls.__hash__

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tree_hash(self)
        return h

    def __getstate__(self) -> dict:
        # bytes hash differently in another process: a copy computes its own
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls


@dataclass(frozen=True)
class Bytes:
    """Exactly one byte whose value is in `mask` (bit i set = byte i allowed)."""
    mask: int


@_hash_once
@dataclass(frozen=True)
class Seq:
    items: tuple


@_hash_once
@dataclass(frozen=True)
class Alt:
    """Any one of `items`; an empty Alt matches nothing (the empty language)."""
    items: tuple


@_hash_once
@dataclass(frozen=True)
class Repeat:
    item: object
    lo: int
    hi: int | None  # None = unbounded


@dataclass(frozen=True)
class Call:
    """Match one instance of another rule (pushdown call): recursive $refs, and large parts
    used in many places."""
    rule: int


@_hash_once
@dataclass(frozen=True)
class Obj:
    """`{` members `}` where `members` are (member_ir, required) emitted in this order,
    comma-separated, optional ones skippable; then `extra` (a member IR) any number of times.
    Between `lo` and `hi` (None = no limit) members in all; extras count each if `extra_counts`,
    else as one together. `any_order`: members (each at most once) and extras in any order,
    no count bounds; the members whose indices are in `untracked` (optional ones) may then
    come any number of times. `extras_anywhere`: extras also before and between members (set
    only with `lo` 0 and an `extra`)."""
    members: tuple
    extra: object | None
    lo: int = 0
    hi: int | None = None
    extra_counts: bool = True
    open: bytes = b"{"
    close: bytes = b"}"
    any_order: bool = False
    extras_anywhere: bool = False
    untracked: frozenset = frozenset()


@_hash_once
@dataclass(frozen=True)
class Leaf:
    """`item` (no calls, no objects) determinised once and copied at every use: the NFA then
    holds one state per position of it instead of dozens, which is what makes subset
    construction of schemas with many strings fast. Used for string bodies, keys and numbers."""
    item: object


@dataclass(frozen=True)
class Counted:
    """The contents of a JSON string of `lo`..`hi` characters (None = no upper bound), matched
    by one copy of the character automaton plus a counter kept beside the automaton state
    (counting.py), instead of one copy of it per counted position."""
    lo: int
    hi: int | None
    char: object = None     # the IR of one character; None: any character


@_hash_once
@dataclass(frozen=True)
class Table:
    """An explicit DFA: per state ((byte mask, target), ...), per state accepting; start 0."""
    edges: tuple
    accept: tuple


EMPTY = Seq(())
NEVER = Alt(())


def byte_mask(values) -> int:
    m = 0
    for v in values:
        m |= 1 << v
    return m


def range_mask(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


_BYTE = tuple(Bytes(1 << b) for b in range(256))   # shared: a large schema spells ~10^5 literal bytes


def lit(data: bytes) -> Seq:
    return _short_lit(data) if len(data) <= 64 else Seq(tuple(map(_BYTE.__getitem__, data)))


@functools.lru_cache(maxsize=8192)   # a large schema spells the same keys hundreds of times
def _short_lit(data: bytes) -> Seq:
    return Seq(tuple(map(_BYTE.__getitem__, data)))


def seq(*items) -> object:
    flat = []
    for it in items:
        if isinstance(it, Seq):
            flat.extend(it.items)
        else:
            flat.append(it)
    if Alt in map(type, flat) and NEVER in flat:      # the type test first: flat is mostly bytes
        return NEVER
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items) -> object:
    flat, seen = [], set()       # a set: comparing every pair of a large enum was quadratic
    for it in items:
        if isinstance(it, Alt):
            flat.extend(it.items)
            seen.update(it.items)
        elif it not in seen:
            flat.append(it)
            seen.add(it)
    return flat[0] if len(flat) == 1 else Alt(tuple(flat))


def opt(item) -> object:
    return Repeat(item, 0, 1)


def chars(ranges: list[tuple[int, int]]) -> object:
    """One Unicode character from the code point ranges, as raw UTF-8."""
    seqs = utf8.sequences(ranges)
    return alt(*(Seq(tuple(Bytes(range_mask(lo, hi)) for lo, hi in s)) for s in seqs))


def size(node: object, limit: int) -> int:
    """The number of IR nodes under `node` (each shared subtree once, each byte every time), counting
    stops at `limit`."""
    seen, todo, n = set(), [node], 0
    while todo and n < limit:
        x = todo.pop()
        if isinstance(x, Bytes):     # lit() shares these: each use is a byte of the body
            n += 1
            continue
        if id(x) in seen:
            continue
        seen.add(id(x))
        n += 1
        if isinstance(x, (Seq, Alt)):
            todo.extend(x.items)
        elif isinstance(x, (Repeat, Leaf)):
            todo.append(x.item)
        elif isinstance(x, Obj):
            todo.extend(m for m, _ in x.members)
            if x.extra is not None:
                todo.append(x.extra)
    return n
