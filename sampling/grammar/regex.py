"""The `pattern` subset: a regex parser producing IR over JSON-encoded string contents.

Supported: literals, `.`, classes `[...]` with ranges and negation, `\\d \\w \\s \\D \\W \\S`,
escapes (`\\n \\t \\r \\f \\v \\xHH \\uHHHH`, escaped punctuation), groups `(...)`, `(?:...)`,
named groups, alternation `|`, quantifiers `? * + {m} {m,} {m,n}` (lazy forms too, same
language). pattern_ir matches the WHOLE string (a leading `^` / trailing `$` are accepted and
implied); search_pattern rewrites a pattern for JSON Schema's unanchored search semantics.
Lookarounds, backreferences, word boundaries, inline flags and anchors in the middle are
rejected.

Validators (Python `re`) use Unicode classes; positive `\\d \\w \\s` here are their ASCII subsets
(sound), while negated forms use the exact Unicode sets so complements never over-accept.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from . import ir, jsonstr, utf8
from .products import difference, intersection
from .errors import UnsupportedSchemaError

Ranges = list[tuple[int, int]]
_ASCII = {"d": [(48, 57)], "w": [(48, 57), (65, 90), (95, 95), (97, 122)], "s": [(9, 13), (32, 32)]}
_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7, "0": 0}


@functools.lru_cache(maxsize=None)
def _unicode_class(letter: str) -> tuple[tuple[int, int], ...]:
    """Exact code point set of Python's `\\d`/`\\w`/`\\s` (surrogates aside): the runs its regex
    engine matches in a string of every code point in order (once per process; testing code
    points one by one in Python was paid by whichever schema first needed it)."""
    runs = re.compile("\\" + letter + "+")
    out: list[tuple[int, int]] = []
    for lo, hi in ((0, 0xD7FF), (0xE000, utf8.MAX_CP)):
        text = np.arange(lo, hi + 1, dtype="<u4").tobytes().decode("utf-32-le")
        out += [(lo + m.start(), lo + m.end() - 1) for m in runs.finditer(text)]
    return tuple(out)


class _Parser:
    def __init__(self, pattern: str, where: str) -> None:
        self.p, self.i, self.where = pattern, 0, where

    def fail(self, what: str) -> UnsupportedSchemaError:
        return UnsupportedSchemaError(
            f"unsupported keyword 'pattern' at {self.where or '/'}: {what} (at offset {self.i} in {self.p!r})")

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def take(self) -> str:
        c = self.peek()
        self.i += 1
        return c

    def parse(self) -> object:
        if self.peek() == "^":
            self.i += 1
        node = self.alternation()
        if self.peek() == "$" and self.i == len(self.p) - 1:
            self.i += 1
        if self.i != len(self.p):
            raise self.fail(f"unexpected {self.peek()!r}")
        return node

    def alternation(self) -> object:
        branches = [self.concat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.concat())
        return ir.alt(*branches)

    def concat(self) -> object:
        items = []
        while self.peek() not in ("", "|", ")"):
            if self.peek() == "$" and self.i == len(self.p) - 1:
                break
            items.append(self.quantified())
        return ir.seq(*items) if items else ir.EMPTY

    def quantified(self) -> object:
        node = self.atom()
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and re.match(r"\{\d+(,\d*)?\}", self.p[self.i:]):
                m = re.match(r"\{(\d+)(,(\d*))?\}", self.p[self.i:])
                self.i += m.end()
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    raise self.fail("quantifier {m,n} with n < m")
                if max(lo, hi or 0) > 1000:
                    raise self.fail("repetition count above 1000")
            else:
                return node
            if self.peek() == "?":      # lazy: same language
                self.i += 1
            elif self.peek() == "+":
                raise self.fail("possessive quantifier")
            node = ir.Repeat(node, lo, hi)

    def atom(self) -> object:
        c = self.take()
        if c == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?P<", self.i) or (self.p.startswith("?<", self.i)
                                                      and self.p[self.i + 2:self.i + 3] not in ("=", "!")):
                self.i = self.p.index(">", self.i) + 1
            elif self.peek() == "?":
                raise self.fail("lookaround, inline flag or other (?...) construct")
            node = self.alternation()
            if self.take() != ")":
                raise self.fail("unbalanced parenthesis")
            return node
        if c == "[":
            return jsonstr.char(self.char_class())
        if c == ".":
            return jsonstr.char(utf8.subtract([(0, utf8.MAX_CP)], [(10, 10)]))
        if c == "\\":
            return jsonstr.char(self.escape(in_negated=False))
        if c in ("^", "$"):
            raise self.fail(f"anchor {c!r} not at the start/end")
        if c in ("*", "+", "?", "{", ")"):
            raise self.fail(f"nothing to repeat before {c!r}" if c != ")" else "unbalanced parenthesis")
        return jsonstr.char([(ord(c), ord(c))])

    def escape(self, in_negated: bool) -> Ranges:
        c = self.take()
        if c == "":
            raise self.fail("trailing backslash")
        if c in "dws":
            return list(_unicode_class(c)) if in_negated else list(_ASCII[c])
        if c in "DWS":
            return utf8.complement(list(_unicode_class(c.lower())))
        if c in _SIMPLE_ESCAPES and not (c == "0" and self.peek().isdigit()):
            return [(_SIMPLE_ESCAPES[c],) * 2]
        if c in "xu":
            n = 2 if c == "x" else 4
            h = self.p[self.i:self.i + n]
            if len(h) != n or not all(ch in "0123456789abcdefABCDEF" for ch in h):
                raise self.fail(f"bad \\{c} escape")
            self.i += n
            return [(int(h, 16),) * 2]
        if c.isdigit() or c in "kbBAZzG":
            raise self.fail(f"backreference or assertion \\{c}")
        if c.isalnum():
            raise self.fail(f"unknown escape \\{c}")
        return [(ord(c), ord(c))]

    def char_class(self) -> Ranges:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: Ranges = []
        first = True
        while True:
            c = self.take()
            if c == "":
                raise self.fail("unterminated character class")
            if c == "]" and not first:
                break
            first = False
            if c == "[" and self.peek() in ":=.":
                raise self.fail("POSIX class syntax")
            if c == "\\":
                item = self.escape(in_negated=negated)
                if len(item) != 1 or item[0][0] != item[0][1]:
                    ranges.extend(item)
                    continue
                lo = item[0][0]
            else:
                lo = ord(c)
            if self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                c2 = self.take()
                if c2 == "\\":
                    item = self.escape(in_negated=negated)
                    if len(item) != 1 or item[0][0] != item[0][1]:
                        raise self.fail("class escape used as a range bound")
                    hi = item[0][0]
                else:
                    hi = ord(c2)
                if hi < lo:
                    raise self.fail("reversed range in character class")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return utf8.complement(ranges) if negated else utf8.normalize(ranges)


def search_pattern(pattern: str) -> str:
    """A pattern whose full matches are the strings `pattern` matches somewhere (JSON Schema's
    search semantics): '^x-' -> '(?:x-).*', 'a$' -> '.*(?:a)'. `.` leaves out line breaks, so
    this is a subset when the match could be surrounded by them (sound)."""
    if not isinstance(pattern, str):
        return pattern        # pattern_ir reports it
    branches = [_unwrapped(b) for b in _top_level_branches(pattern)]
    if len(branches) == 1 and branches[0] != pattern:
        return search_pattern(branches[0])
    anchored = [b for b in branches if b.startswith("^") or _ends_anchored(b)]
    if len(branches) > 1 and anchored:
        # '^a|b$': anchors per branch. The unanchored ones share one '.*' on each side: each
        # '.*' is a copy of the whole character automaton, and their subsets multiply.
        free = [b for b in branches if b not in anchored]
        parts = ([search_pattern("|".join(free))] if free else []) + [search_pattern(b) for b in anchored]
        return "|".join(f"(?:{p})" for p in parts)
    core, head, tail = pattern, ".*", ".*"
    if core.startswith("^"):
        core, head = core[1:], ""
    if _ends_anchored(core):
        core, tail = core[:-1], ""
    else:
        core = _least_trailing_repeat(core)
    return f"{head}(?:{core}){tail}"


_TRAILING_REPEAT = re.compile(r"(?:\*|\+|\?|\{(\d+)(?:,\d*)?\})\??$")


def _least_trailing_repeat(core: str) -> str:
    """A quantifier ending an unanchored pattern needs only its least count: 'x{1,255}' is
    found somewhere exactly where 'x' is. (Unrolling the 255 would multiply the automaton.)"""
    m = _TRAILING_REPEAT.search(core)
    if m is None:
        return core
    before = core[: m.start()]
    slashes = len(before) - len(before.rstrip("\\"))
    if slashes % 2 or not before or before.endswith(("(", "|")):
        return core           # an escaped quantifier character, or nothing to repeat
    least = {"*": "0", "?": "0", "+": "1"}.get(core[m.start()], m.group(1))
    return f"{before}{{{least}}}"


def _ends_anchored(pattern: str) -> bool:
    """Ends with a `$` that is not escaped (an odd number of backslashes before it escapes it)."""
    if not pattern.endswith("$"):
        return False
    slashes = len(pattern) - 1 - len(pattern[:-1].rstrip("\\"))
    return slashes % 2 == 0


def _structure(pattern: str):
    """(index, character, group depth before it) of each `( ) |` outside classes and escapes."""
    depth, in_class, i = 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]" or pattern[i + 1:i + 3] == "^]":   # a leading ] is literal
                i += 2 if pattern[i + 1] == "]" else 3
                continue
        elif c in "()|":
            yield i, c, depth
            depth += {"(": 1, ")": -1}.get(c, 0)
        i += 1


def _top_level_branches(pattern: str) -> list[str]:
    """The pattern split at `|` outside groups, classes and escapes."""
    cuts = [i for i, c, depth in _structure(pattern) if c == "|" and depth == 0]
    return [pattern[a + 1:b] for a, b in zip([-1, *cuts], [*cuts, len(pattern)])]


def _unwrapped(branch: str) -> str:
    """'(x)' or '(?:x)' spanning a whole branch: x, whose anchors then read as the branch's."""
    if not (branch.startswith("(") and branch.endswith(")")) or branch.startswith("(?") and not branch.startswith("(?:"):
        return branch
    for i, c, depth in _structure(branch):
        if c == ")" and depth == 1:
            if i != len(branch) - 1:
                return branch              # '(a)(b)': the first group closes early
            return branch[3:-1] if branch.startswith("(?:") else branch[1:-1]
    return branch


def pattern_ir(pattern: str, where: str) -> object:
    """IR for the contents (without quotes) of JSON strings fully matching `pattern`."""
    if not isinstance(pattern, str):
        from .errors import SchemaError
        raise SchemaError(f"'pattern' at {where or '/'} must be a string")
    try:
        re.compile(pattern)
    except re.error as e:
        from .errors import SchemaError
        raise SchemaError(f"invalid 'pattern' at {where or '/'}: {e}") from None
    hit = _PATTERNS.get(pattern)
    if hit is None:
        hit = _Parser(pattern, where).parse()     # errors are not cached: they name `where`
        if len(_PATTERNS) > 4096:
            _PATTERNS.clear()
        _PATTERNS[pattern] = hit
    return hit     # the same object for the same pattern: its leaf automaton is found by identity


_PATTERNS: dict[str, object] = {}


@functools.lru_cache(maxsize=1024)
def search_ir(pattern: str, where: str) -> object:
    """IR for the contents of JSON strings in which `pattern` matches somewhere (JSON Schema's
    reading). Lookaheads right after a leading `^` are supported: `^(?!X)Y` is the strings
    matching `^Y` that do not start with a match of X (their difference as automata), `^(?=X)Y`
    those that do (their intersection)."""
    split = _leading_lookaheads(pattern) if isinstance(pattern, str) else None
    if split is None or len(_top_level_branches(pattern)) > 1:
        return pattern_ir(search_pattern(pattern), where)
    rest, looks = split
    node = pattern_ir(search_pattern(rest), where)
    for negative, body in looks:
        if negative and INEXACT.search(body):
            # `\d \w \s` are ASCII subsets here: subtracting a subset would let through
            # strings the validator's lookahead refuses.
            raise _Parser(pattern, where).fail("negative lookahead with \\d, \\w or \\s")
        # Strings starting with a match of X; a branch's own `$` makes it the whole string.
        starts = "|".join(f"(?:{b[:-1]})" if _ends_anchored(b) else f"(?:{b})(?:.|\n)*"
                          for b in _top_level_branches(body))
        node = (difference if negative else intersection)(node, pattern_ir(starts, where))
        if node is None:
            raise _Parser(pattern, where).fail("lookahead: too large an automaton")
    return node


INEXACT = re.compile(r"(?<!\\)(?:\\\\)*\\[dws]")


def _leading_lookaheads(pattern: str) -> tuple[str, list[tuple[bool, str]]] | None:
    """'^(?!X)(?=Z)Y' -> ('^Y', [(True, 'X'), (False, 'Z')]); None without a leading lookahead."""
    looks, i = [], 1
    if not pattern.startswith("^"):
        return None
    while pattern.startswith(("(?!", "(?="), i):
        close = next((j for j, c, depth in _structure(pattern[i:]) if c == ")" and depth == 1), None)
        if close is None:
            return None
        looks.append((pattern[i + 2] == "!", pattern[i + 3:i + close]))
        i += close + 1
    return ("^" + pattern[i:], looks) if looks else None


def _nonempty_repeat(pattern: str, lo: int, hi: int | None, sre_parse) -> str | None:
    """`(?:X)*` under a minLength only the empty match breaks (every X is at least `lo` long):
    `(?:X)+`. Exact: only the zero-repetition match is dropped. The JSON pointer format is one."""
    m = _STARRED_GROUP.fullmatch(pattern)
    if m is None or hi is not None:
        return None
    try:
        inner_min = sre_parse.parse(m.group(1)).getwidth()[0]
    except (re.error, OverflowError, RecursionError):
        return None   # the parentheses did not close where the match assumed
    return f"(?:{m.group(1)})+" if inner_min >= lo else None


_STARRED_GROUP = re.compile(r"\^?\(\?:(.*)\)\*\$?", re.S)
_ATOM = r"(?:\[(?:\\.|[^\]\\])+\]|\\[dwsDWS.\-_/]|\.|[A-Za-z0-9 _/:@-])"
_SINGLE = re.compile(rf"\^?((?:{_ATOM})*?)({_ATOM})(\*|\+|\{{(\d+)(?:,(\d*))?\}})\$?")


def counted_split(pattern: str, lo: int, hi: int | None) -> tuple[str, str, int, int | None] | None:
    """A whole-string pattern of fixed single characters then one repeated character class
    (`^v[0-9]{1,200}$`), within length bounds [lo, hi]: (the fixed part, the class, the least and
    most repetitions); None for any other pattern."""
    if not pattern.startswith("^") or not _ends_anchored(pattern):
        return None
    return _single_repeat(pattern, lo, hi)


def _single_repeat(pattern: str, lo: int, hi: int | None) -> tuple[str, str, int, int | None] | None:
    """(fixed atoms, repeated atom, least and most repetitions within [lo, hi]) of a pattern
    that _SINGLE matches whole; None otherwise."""
    m = _SINGLE.fullmatch(pattern)
    if m is None:
        return None
    fixed = len(re.findall(_ATOM, m.group(1)))
    q = m.group(3)
    qlo, qhi = {"*": (0, None), "+": (1, None)}.get(q, (None, None))
    if q.startswith("{"):
        qlo = int(m.group(4))
        qhi = qlo if "," not in q else (int(m.group(5)) if m.group(5) else None)
    nlo = max(lo - fixed, qlo)
    nhi = None if hi is None else hi - fixed
    if qhi is not None:
        nhi = qhi if nhi is None else min(nhi, qhi)
    return m.group(1), m.group(2), nlo, nhi


def length_bounded_pattern(pattern: str, lo: int, hi: int | None, cap: int) -> str | None:
    """A pattern for the strings fully matching `pattern` whose length is in [lo, hi], when that
    is easy: the bounds already hold for every match, or the pattern is fixed single characters
    followed by one repeated character class (`^[a-z][a-z0-9-]*$`: the repetition is tightened,
    to at most `cap` characters). Otherwise None."""
    try:
        import re._parser as sre_parse
    except ImportError:   # Python < 3.11
        import sre_parse  # type: ignore[no-redef]
    try:
        wmin, wmax = sre_parse.parse(pattern).getwidth()
    except (re.error, OverflowError, RecursionError):
        return None
    if lo <= wmin and (hi is None or wmax <= hi):
        return pattern
    nonempty = _nonempty_repeat(pattern, lo, hi, sre_parse)
    if nonempty is not None:
        return nonempty
    split = _single_repeat(pattern, lo, hi)
    if split is None:
        return None
    fixed, atom, nlo, nhi = split
    if nhi is not None and nhi > cap:     # unrolled below: longer matches are not generated
        nhi = max(cap, nlo)
    if nlo > cap or (nhi is not None and nhi < nlo):
        return None
    return f"{fixed}{atom}{{{nlo},{'' if nhi is None else nhi}}}"
