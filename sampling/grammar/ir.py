"""A tiny regular-expression IR over bytes, plus calls to other rules (for recursion).

Schema compilation produces IR trees; `thompson.py` turns them into an NFA. IR nodes are
immutable and may be shared: every use is instantiated afresh by the NFA builder.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
from dataclasses import dataclass

from . import utf8


class _Node:
    """IR nodes carry slots, not a __dict__ each (one object for the garbage collector to
    track, not two), and keep their hash once computed: a dataclass hash walks the whole tree
    each time, and IR trees are hashed again and again (leaf cache keys, alt() deduplication)."""
    __slots__ = ("_hash",)


def _hash_once(cls):
    fields_of = operator.attrgetter(*(f.name for f in dataclasses.fields(cls)))    # in C: no frame

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash((cls, fields_of(self)))
            object.__setattr__(self, "_hash", h)    # not a field: a pickled copy computes its own
            return h

    cls.__hash__ = __hash__
    return cls


class Bytes(int):
    """Exactly one byte whose value is in the set: bit i set = byte i allowed. An int, so that
    the many literal bytes of a large schema hash and compare in C (a Python-level hash or
    comparison per byte is a frame pushed each time, see README.md, "Frame stack")."""
    __slots__ = ()

    def __repr__(self) -> str:
        return f"Bytes(mask={int(self)})"


@_hash_once
@dataclass(frozen=True, slots=True)
class Seq(_Node):
    items: tuple


@_hash_once
@dataclass(frozen=True, slots=True)
class Alt(_Node):
    """Any one of `items`; an empty Alt matches nothing (the empty language)."""
    items: tuple


@_hash_once
@dataclass(frozen=True, slots=True)
class Repeat(_Node):
    item: object
    lo: int
    hi: int | None  # None = unbounded


@dataclass(frozen=True, slots=True)
class Call:
    """Match one instance of another rule (pushdown call): recursive $refs, and large parts
    used in many places."""
    rule: int


@_hash_once
@dataclass(frozen=True, slots=True)
class Obj(_Node):
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
@dataclass(frozen=True, slots=True)
class Leaf(_Node):
    """`item` (no calls, no objects) determinised once and copied at every use: the NFA then
    holds one state per position of it instead of dozens, which is what makes subset
    construction of schemas with many strings fast. Used for string bodies, keys and numbers."""
    item: object


@dataclass(frozen=True, slots=True)
class Counted:
    """The contents of a JSON string of `lo`..`hi` characters (None = no upper bound), matched
    by one copy of the character automaton plus a counter kept beside the automaton state
    (counting.py), instead of one copy of it per counted position."""
    lo: int
    hi: int | None
    char: object = None     # the IR of one character; None: any character


@_hash_once
@dataclass(frozen=True, slots=True)
class Table(_Node):
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
    # The type test first, in C: flat is mostly bytes.
    if Alt in map(type, flat) and any(type(it) is Alt and not it.items for it in flat):
        return NEVER
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items) -> object:
    flat, seen = [], set()       # a set: comparing every pair of a large enum was quadratic
    for it in items:
        if isinstance(it, Alt):
            flat.extend(it.items)
            seen.update(it.items)
        else:
            n = len(seen)
            seen.add(it)            # one hash per item, not two
            if len(seen) > n:
                flat.append(it)
    return flat[0] if len(flat) == 1 else Alt(tuple(flat))


def opt(item) -> object:
    return Repeat(item, 0, 1)


def chars(ranges: list[tuple[int, int]]) -> object:
    """One Unicode character from the code point ranges, as raw UTF-8."""
    seqs = utf8.sequences(ranges)
    return alt(*(Seq(tuple(byte_set(lo, hi) for lo, hi in s)) for s in seqs))


@functools.lru_cache(maxsize=4096)
def byte_set(lo: int, hi: int) -> Bytes:
    """The shared node for one byte in lo..hi: patterns spell the same sets again and again,
    one object each instead of one per use (fewer objects for the garbage collector)."""
    return _BYTE[lo] if lo == hi else Bytes(range_mask(lo, hi))


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
