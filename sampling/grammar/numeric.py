"""Byte IR for JSON numbers: plain integers, exact integer ranges, bounded decimals."""
from __future__ import annotations

import functools
import math

from . import ir

_D = ir.Bytes(ir.range_mask(0x30, 0x39))
_D19 = ir.Bytes(ir.range_mask(0x31, 0x39))
_DIGITS = ir.Repeat(_D, 1, None)
_NONZERO_FRAC = ir.seq(ir.lit(b"."), ir.Repeat(_D, 0, None), ir.Bytes(ir.range_mask(0x31, 0x39)), ir.Repeat(_D, 0, None))


def _digit(lo: int, hi: int) -> ir.Bytes:
    return ir.Bytes(ir.range_mask(0x30 + lo, 0x30 + hi))


@functools.lru_cache(maxsize=None)
def integer() -> object:
    """Any JSON integer, without `-0` (a harmless restriction)."""
    return ir.alt(ir.lit(b"0"), ir.seq(ir.opt(ir.lit(b"-")), _D19, ir.Repeat(_D, 0, None)))


@functools.lru_cache(maxsize=None)
def number() -> object:
    int_part = ir.seq(ir.opt(ir.lit(b"-")), ir.alt(ir.lit(b"0"), ir.seq(_D19, ir.Repeat(_D, 0, None))))
    frac = ir.opt(ir.seq(ir.lit(b"."), _DIGITS))
    exp = ir.opt(ir.seq(ir.Bytes(ir.byte_mask(b"eE")), ir.opt(ir.Bytes(ir.byte_mask(b"+-"))), _DIGITS))
    return ir.seq(int_part, frac, exp)


def _same_length(lo: str, hi: str) -> object:
    """Decimal strings of len(lo) == len(hi) digits with lo <= value <= hi (as strings)."""
    if lo == hi:
        return ir.lit(lo.encode())
    a, b = int(lo[0]), int(hi[0])
    k = len(lo) - 1
    if k == 0:
        return _digit(a, b)
    if a == b:
        return ir.seq(ir.lit(lo[0].encode()), _same_length(lo[1:], hi[1:]))
    if lo[1:] == "0" * k and hi[1:] == "9" * k:
        return ir.seq(_digit(a, b), ir.Repeat(_D, k, k))
    parts = [ir.seq(ir.lit(lo[0].encode()), _same_length(lo[1:], "9" * k))]
    if b - a > 1:
        parts.append(ir.seq(_digit(a + 1, b - 1), ir.Repeat(_D, k, k)))
    parts.append(ir.seq(ir.lit(hi[0].encode()), _same_length("0" * k, hi[1:])))
    return ir.alt(*parts)


def _non_negative(lo: int, hi: int | None) -> object:
    """Canonical decimal (no leading zeros) of integers in [lo, hi], lo >= 0, hi None = inf."""
    if hi is not None and hi < lo:
        return ir.NEVER
    parts = []
    if lo == 0:
        parts.append(ir.lit(b"0"))
        lo = 1
        if hi == 0:
            return parts[0]
    length = len(str(lo))
    while hi is None or length <= len(str(hi)):
        top = 10 ** length - 1
        if hi is None and lo == 10 ** (length - 1):
            # every number of this length and longer
            parts.append(ir.seq(_D19, ir.Repeat(_D, length - 1, None)))
            break
        parts.append(_same_length(str(lo), str(top if hi is None else min(hi, top))))
        lo = top + 1
        length += 1
    return ir.alt(*parts)


def integer_range(lo: int | None, hi: int | None) -> object:
    """Exact automaton for integers in [lo, hi] (either bound may be None)."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_non_negative(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        # negatives -k with k in [max(1, -hi), -lo]
        kmin = 1 if hi is None or hi >= 0 else -hi
        parts.append(ir.seq(ir.lit(b"-"), _non_negative(kmin, None if lo is None else -lo)))
    return ir.alt(*parts)


def bounded_number(lo: float | None, lo_excl: bool, hi: float | None, hi_excl: bool) -> object:
    """A sound subset of numbers within bounds: integers in range, plus `I.F` decimals whose
    every possible fraction stays in range. No exponent notation."""
    ilo = None if lo is None else (math.floor(lo) + 1 if lo_excl and lo == math.floor(lo) else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hi_excl and hi == math.ceil(hi) else math.floor(hi))
    parts = [integer_range(ilo, ihi)]
    frac = ir.seq(ir.lit(b"."), _DIGITS)
    # "I.F" with I >= 0 lies in [I, I+1): needs I >= lo (> lo if exclusive) and I + 1 <= hi.
    plo = 0 if lo is None else max(0, math.floor(lo) + 1 if lo_excl or lo != math.floor(lo) else int(lo))
    phi = None if hi is None else math.floor(hi) - 1
    if phi is None or phi >= plo:
        parts.append(ir.seq(_non_negative(plo, phi), frac))
    # An exclusive integer lower bound I >= 0: "I.F" with a non-zero digit in F is above it.
    if lo_excl and lo is not None and lo >= 0 and lo == math.floor(lo) and (hi is None or int(lo) + 1 <= hi):
        parts.append(ir.seq(ir.lit(str(int(lo)).encode()), _NONZERO_FRAC))
    # "-I.F" lies in (-(I+1), -I]: needs -(I+1) >= lo and -I <= hi (< hi if exclusive).
    nlo = 0 if hi is None else max(0, math.floor(-hi) + 1 if hi_excl or -hi != math.floor(-hi) else int(-hi))
    nhi = None if lo is None else math.floor(-lo) - 1
    if nhi is None or nhi >= nlo:
        parts.append(ir.seq(ir.lit(b"-"), _non_negative(nlo, nhi), frac))
    if hi_excl and hi is not None and hi <= 0 and hi == math.floor(hi) and (lo is None or int(hi) - 1 >= lo):
        parts.append(ir.seq(ir.lit(b"-" + str(-int(hi)).encode()), _NONZERO_FRAC))
    return ir.alt(*parts)
