"""Byte IR for JSON numbers: plain integers, exact integer ranges, bounded decimals."""
from __future__ import annotations

import decimal
import functools
import math

from . import ir

_D = ir.Bytes(ir.range_mask(0x30, 0x39))
_D19 = ir.Bytes(ir.range_mask(0x31, 0x39))
_DIGITS = ir.Repeat(_D, 1, None)
_NONZERO_FRAC = ir.seq(ir.lit(b"."), ir.Repeat(_D, 0, None), ir.Bytes(ir.range_mask(0x31, 0x39)), ir.Repeat(_D, 0, None))


def _digit(lo: int, hi: int) -> ir.Bytes:
    return ir.byte_set(0x30 + lo, 0x30 + hi)


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
    """Canonical decimal (no leading zeros) of integers in [lo, hi], lo >= 0, hi None = inf.
    A bound past 40 digits (a float's 1.8e308 read as an integer) is drawn in to 40 digits:
    the automaton would nest one level per digit, and no one writes those integers."""
    if hi is not None and hi > _HUGE >= lo:
        hi = _HUGE
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


_HUGE = 10 ** 40 - 1


def integer_range(lo: int | None, hi: int | None) -> object:
    """Exact automaton for integers in [lo, hi] (either bound may be None), but see _HUGE."""
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
    every possible fraction stays in range; exponent notation only beside a bound at or past 0."""
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
    # An inclusive integer bound written with a zero fraction ("10.0" under maximum 10): the
    # pieces above stop short of the bound's own unit interval on that side.
    zeros = ir.seq(ir.lit(b"."), ir.Repeat(_digit(0, 0), 1, None))
    if hi is not None and not hi_excl and hi == math.floor(hi) and hi >= 0 and _admits(int(hi), lo, lo_excl):
        parts.append(ir.seq(ir.lit(str(int(hi)).encode()), zeros))
    if lo is not None and not lo_excl and lo == math.floor(lo) and lo < 0 and _admits(int(lo), None, False, hi, hi_excl):
        parts.append(ir.seq(ir.lit(str(int(lo)).encode()), zeros))
    parts.extend(_fractional_bounds(lo, lo_excl, hi, hi_excl))
    parts.extend(_exponent_forms(lo, lo_excl, hi, hi_excl))
    return ir.alt(*parts)


def _exponent_forms(lo, lo_excl, hi, hi_excl) -> list[object]:
    """Exponent notation where the bounds allow every number of one sign: `1e-06` under
    `minimum: 0`. A mantissa without leading zeros and an exponent of at most 2 digits keep
    the value off 0 after parsing (1e-99 is far from the smallest float)."""
    mantissa = ir.seq(_D19, ir.Repeat(_D, 0, None), ir.opt(ir.seq(ir.lit(b"."), _DIGITS)))
    exp = ir.seq(ir.Bytes(ir.byte_mask(b"eE")), ir.opt(ir.Bytes(ir.byte_mask(b"+-"))), ir.Repeat(_D, 1, 2))
    parts = []
    if hi is None and (lo is None or lo <= 0):
        parts.append(ir.seq(mantissa, exp))
    if lo is None and (hi is None or hi >= 0):
        parts.append(ir.seq(ir.lit(b"-"), mantissa, exp))
    return parts


def _admits(x: int, lo, lo_excl: bool, hi=None, hi_excl: bool = False) -> bool:
    return ((lo is None or x > lo or (x == lo and not lo_excl))
            and (hi is None or x < hi or (x == hi and not hi_excl)))


def _fractional_bounds(lo, lo_excl, hi, hi_excl) -> list[object]:
    """`I.F` in the unit intervals holding a non-integer bound (0.5 <= 0.75 under minimum 0.5),
    compared digit by digit. Worked on magnitudes: the negative side mirrors the bounds. At
    most 15 significant digits, so that decimal order is float order after parsing."""
    parts = []
    if hi is None or hi >= 0:
        low = (lo, lo_excl) if lo is not None and lo >= 0 else (None, False)
        parts.extend(_unit_pieces(b"", *low, hi, hi_excl))
    if lo is None or lo < 0:
        low = (-hi, hi_excl) if hi is not None and hi <= 0 else (None, False)
        parts.extend(_unit_pieces(b"-", *low, None if lo is None else -lo, lo_excl))
    return parts


def _unit_pieces(sign: bytes, mlo, mlo_x: bool, mhi, mhi_x: bool) -> list[object]:
    """Magnitudes in [mlo, mhi] (None = no bound) lying in the unit interval of a non-integer bound."""
    a = None if mlo is None or mlo == math.floor(mlo) else math.floor(mlo)
    b = None if mhi is None or mhi == math.floor(mhi) else math.floor(mhi)
    if a is not None and a == b:
        return [_piece(sign, a, _decimal(mlo), mlo_x, _decimal(mhi), mhi_x)]
    pieces = []
    if a is not None:
        pieces.append(_piece(sign, a, _decimal(mlo), mlo_x, None, False))
    if b is not None:
        pieces.append(_piece(sign, b, None, mlo is not None and mlo == b and mlo_x, _decimal(mhi), mhi_x))
    return pieces


def _decimal(x: float) -> str:
    """Fraction digits of the shortest repr of x >= 0, without trailing zeros."""
    return format(decimal.Decimal(repr(x)), "f").partition(".")[2].rstrip("0")


def _piece(sign: bytes, whole: int, low: str | None, low_x: bool, high: str | None, high_x: bool) -> object:
    """`sign whole . F` with 0.low <= 0.F <= 0.high (None: no bound; `_x`: strictly)."""
    width = 15 - len(str(whole))
    if max(len(low or ""), len(high or "")) > width:
        return ir.NEVER
    # F has at most `width` digits: "> x" is ">= x plus one unit in the last place".
    a = int((low or "").ljust(width, "0")) + (1 if low_x else 0)
    b = (int(high.ljust(width, "0")) if high is not None else 10 ** width - 1) - (1 if high_x else 0)
    if a > b or a >= 10 ** width or b < 0:
        return ir.NEVER
    frac = _digits_between(str(a).zfill(width), str(b).zfill(width), 0, True, True)
    return ir.seq(ir.lit(sign + str(whole).encode() + b"."), frac)


def _digits_between(a: str, b: str, i: int, tight_low: bool, tight_high: bool) -> object:
    """Digits F (1 to len(a) of them) after a[:i] / b[:i], with a <= F padded with zeros <= b."""
    width = len(a)
    if i == width:
        return ir.EMPTY
    options = []
    if i and (not tight_low or a[i:] == "0" * (width - i)):
        options.append(ir.EMPTY)          # F ends here: the zeros that follow are >= a's rest
    first = int(a[i]) if tight_low else 0
    last = int(b[i]) if tight_high else 9
    if tight_low and tight_high and first == last:
        options.append(ir.seq(ir.lit(a[i].encode()), _digits_between(a, b, i + 1, True, True)))
    else:
        if tight_low:
            options.append(ir.seq(ir.lit(a[i].encode()), _digits_between(a, b, i + 1, True, False)))
        if tight_high:
            options.append(ir.seq(ir.lit(b[i].encode()), _digits_between(a, b, i + 1, False, True)))
        free_lo, free_hi = first + tight_low, last - tight_high
        if free_lo <= free_hi:
            options.append(ir.seq(_digit(free_lo, free_hi), ir.Repeat(_D, 0, width - i - 1)))
    return ir.alt(*options)


MAX_DIVISOR = 4096


def multiples(k: int) -> ir.Table:
    """The JSON integers divisible by k: the remainder of the digits so far is the state."""
    digits = [ir.byte_mask([ord(str(d))]) for d in range(10)]
    first = 2           # states: 0 start, 1 after "-", 2 the integer 0, 3 + r remainder r
    rem = lambda r: 3 + r
    edges = [
        ((ir.byte_mask(b"-"), 1), (digits[0], first)) + tuple((digits[d], rem(d % k)) for d in range(1, 10)),
        tuple((digits[d], rem(d % k)) for d in range(1, 10)),
        (),
    ] + [tuple((digits[d], rem((10 * r + d) % k)) for d in range(10)) for r in range(k)]
    return ir.Table(tuple(_merge_edges(e) for e in edges), (False, False, True) + tuple(r == 0 for r in range(k)))


def _merge_edges(edges: tuple) -> tuple:
    """One (mask, target) per target, as ir.Table expects."""
    by_target: dict[int, int] = {}
    for mask, target in edges:
        by_target[target] = by_target.get(target, 0) | mask
    return tuple((m, t) for t, m in sorted(by_target.items()))
