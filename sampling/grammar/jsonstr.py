"""How one Unicode character may be written inside a JSON string literal, as byte IR.

A character is written raw (UTF-8) when JSON allows it, or escaped when it must be (`"`, `\\`,
controls). `\\uXXXX` escapes of arbitrary characters (including surrogate pairs) are offered
only for unconstrained characters (`any_char`), since mapping hex digits back to a character
class would multiply automaton size for no practical gain.
"""
from __future__ import annotations

import functools

from . import ir, utf8

_SHORT = {0x22: b'"', 0x5C: b"\\", 0x2F: b"/", 0x08: b"b", 0x0C: b"f", 0x0A: b"n", 0x0D: b"r", 0x09: b"t"}
_HEX = b"0123456789abcdefABCDEF"


def _in(cp: int, ranges) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


@functools.lru_cache(maxsize=None)
def _hex_digit(value_lo: int, value_hi: int) -> ir.Bytes:
    """A hex digit (either case) whose value lies in [value_lo, value_hi]."""
    allowed = [b for b in _HEX if value_lo <= int(chr(b), 16) <= value_hi]
    return ir.Bytes(ir.byte_mask(allowed))


def _u_escape(cp: int) -> object:
    return ir.seq(ir.lit(b"\\u"), *(_hex_digit(int(h, 16), int(h, 16)) for h in f"{cp:04x}"))


def char(ranges: list[tuple[int, int]], *, unconstrained: bool = False) -> object:
    """IR for one character from `ranges` as written inside a JSON string."""
    ranges = utf8.normalize(ranges)
    raw = utf8.subtract(ranges, [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
    options = [ir.chars(raw)] if raw else []
    for cp, letter in _SHORT.items():
        if _in(cp, ranges):
            options.append(ir.lit(b"\\" + letter))
    for cp in range(0x20):
        if _in(cp, ranges):
            options.append(_u_escape(cp))
    if unconstrained:
        options.append(_any_u_escape())
    return ir.alt(*options)


def _any_u_escape() -> object:
    any_hex = _hex_digit(0, 15)
    # \uXXXX for code points >= 0x20 outside the surrogate block (controls were added above)...
    bmp = ir.alt(
        ir.seq(_hex_digit(0, 0), _hex_digit(0, 0), _hex_digit(2, 15), any_hex),
        ir.seq(_hex_digit(0, 0), _hex_digit(1, 15), any_hex, any_hex),
        ir.seq(_hex_digit(1, 12), any_hex, any_hex, any_hex),
        ir.seq(_hex_digit(13, 13), _hex_digit(0, 7), any_hex, any_hex),
        ir.seq(_hex_digit(14, 15), any_hex, any_hex, any_hex),
    )
    # ... and a high surrogate followed by a low surrogate (one character once decoded).
    pair = ir.seq(
        _hex_digit(13, 13), _hex_digit(8, 11), any_hex, any_hex,
        ir.lit(b"\\u"), _hex_digit(13, 13), _hex_digit(12, 15), any_hex, any_hex,
    )
    return ir.seq(ir.lit(b"\\u"), ir.alt(bmp, pair))


ANY_RANGES = [(0, utf8.MAX_CP)]


@functools.lru_cache(maxsize=None)
def any_char() -> object:
    return char(ANY_RANGES, unconstrained=True)


@functools.lru_cache(maxsize=None)
def counted_char() -> object:
    """A character of a length-bounded string: raw, or a two-byte escape (no \\uXXXX at all,
    so no control character besides \\b \\t \\n \\f \\r): a smaller automaton per counted
    position, since bounded strings are unrolled."""
    raw = utf8.subtract([(0, utf8.MAX_CP)], [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
    return ir.alt(ir.chars(raw), ir.seq(ir.lit(b"\\"), ir.Bytes(ir.byte_mask(b'"\\/bfnrt'))))
