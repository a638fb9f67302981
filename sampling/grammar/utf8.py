"""Code point ranges -> UTF-8 byte-range sequences, so character classes become byte automata.

A code point range [lo, hi] is split into pieces whose UTF-8 encodings form "rectangles":
each byte position ranges independently over an interval. Surrogates (U+D800..U+DFFF) are
never encoded: they are not valid UTF-8.
"""
from __future__ import annotations

MAX_CP = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_LENGTH_LIMITS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CP))

ByteSeq = list[tuple[int, int]]  # one (lo, hi) byte interval per byte position


def normalize(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged, clipped to valid code points, surrogates removed."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        lo, hi = max(lo, 0), min(hi, MAX_CP)
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return subtract(out, [_SURROGATES], _norm=False)


def subtract(a: list[tuple[int, int]], b: list[tuple[int, int]], _norm: bool = True) -> list[tuple[int, int]]:
    """Ranges of a minus ranges of b."""
    if _norm:
        a = normalize(a)
    out = []
    for lo, hi in a:
        pieces = [(lo, hi)]
        for blo, bhi in b:
            nxt = []
            for plo, phi in pieces:
                if bhi < plo or blo > phi:
                    nxt.append((plo, phi))
                    continue
                if plo < blo:
                    nxt.append((plo, blo - 1))
                if bhi < phi:
                    nxt.append((bhi + 1, phi))
            pieces = nxt
        out.extend(pieces)
    return out


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return subtract([(0, MAX_CP)], ranges)


def encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


def sequences(ranges: list[tuple[int, int]]) -> list[ByteSeq]:
    """UTF-8 byte-interval sequences whose union encodes exactly the given code points."""
    out: list[ByteSeq] = []
    for lo, hi in normalize(ranges):
        for llo, lhi in _LENGTH_LIMITS:
            a, b = max(lo, llo), min(hi, lhi)
            if a <= b:
                _split(a, b, out)
    return out


def _split(lo: int, hi: int, out: list[ByteSeq]) -> None:
    n = len(encode(lo))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            # The range spans several values of the higher bytes: cut it where the lower
            # i continuation bytes wrap, so each piece is a rectangle.
            if lo & m:
                _split(lo, lo | m, out)
                _split((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _split(lo, (hi & ~m) - 1, out)
                _split(hi & ~m, hi, out)
                return
    out.append(list(zip(encode(lo), encode(hi))))
