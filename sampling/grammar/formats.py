"""`format` values, each compiled as a `pattern` (a sound subset of what validators accept).

Every pattern here is a strict subset of its format (ASCII only, common forms only), so output
always validates; a valid value outside the subset (e.g. an IPv6 address with an embedded IPv4
part, a URI with an IPv6 host) is not generated. Formats JSON Schema defines that are not
here are refused by name (REFUSED_FORMATS); any other format name is an annotation and ignored,
as JSON Schema says of unknown formats.
"""
from __future__ import annotations

_DATE = (r"[1-9]\d{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
         r"|02-(?:0[1-9]|1\d|2[0-8]))")  # 29 February is left out (leap years), and years before 1000
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_HEX = "[0-9a-fA-F]"
_H16 = _HEX + "{1,4}"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,20}[A-Za-z0-9])?"
# At most 8 labels of at most 22 characters: under the 253 characters a host name may have.
_HOST = rf"{_LABEL}(?:\.{_LABEL}){{0,6}}\.[A-Za-z](?:[A-Za-z0-9-]{{0,20}}[A-Za-z0-9])?|[A-Za-z](?:[A-Za-z0-9-]{{0,20}}[A-Za-z0-9])?"
_PCT = f"%{_HEX}{{2}}"
_PCHAR = rf"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_SEGMENT = rf"{_PCHAR}*"
_QUERY = rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
_USERINFO = rf"(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|{_PCT})*@)?"
_REG_NAME = rf"(?:[A-Za-z0-9._~!$&'()*+,;=-]|{_PCT})*"
_PATHS = rf"(?:/{_SEGMENT})*"
# RFC 3986: an authority (its host any registered name, possibly empty as in file:///path), or
# a path that does not start with "//" (it would read as an authority): absolute ("/a"),
# rootless ("isbn:123") or empty.
_URI = (rf"{_SCHEME}:(?://{_USERINFO}{_REG_NAME}(?::\d*)?{_PATHS}"
        rf"|/{_PCHAR}+{_PATHS}|{_PCHAR}+{_PATHS}|){_QUERY}")
# A relative reference's first segment has no ":" (it would read as a scheme).
_RELATIVE = (rf"(?:/?(?:[A-Za-z0-9._~!$&'()*+,;=@-]|{_PCT})+{_PATHS}|/){_QUERY}"
             rf"|[?#](?:{_PCHAR}|[/?])*")


def _ipv6() -> str:
    full = rf"(?:{_H16}:){{7}}{_H16}"
    # "::" stands for one or more groups: k groups before it and at most 7 - k after it.
    short = []
    for k in range(8):
        before = "" if k == 0 else rf"(?:{_H16}:){{{k - 1}}}{_H16}"
        after = "" if k == 7 else rf"(?:{_H16}(?::{_H16}){{0,{6 - k}}})?"
        short.append(before + "::" + after)
    return "|".join([full, *short])


_DUR_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
_DURATION = rf"P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)"
_POINTER = r"(?:/(?:[A-Za-z0-9_.-]|~[01])*)*"

# Regular expressions: a regular subset (groups nested at most two deep) of what Python's `re`
# and ECMA-262 both compile. Quantifier bounds never decrease ({m,n} with n >= 10 > m), a
# quantifier always follows an atom, and a class holds no "[" nor a doubled "&", "|", "~" or "-"
# (Python warns of future set operations).
_RE_LITERAL = r"""[A-Za-z0-9 _,:;!@#%&=<>'"/~-]"""
_RE_ESCAPE = r"\\[dDwWsSntr.\\/()\[\]{}*+?^$|-]"
_RE_CLASS = r"""\[\^?(?:[A-Za-z0-9 _.,:;@#%=/'"+*?()$]|\\[dDwWsS.\\\-\[\]^/]|a-z|A-Z|0-9)+\]"""
_RE_QUANT = r"(?:(?:[*+?]|\{\d\d?,?\}|\{\d,[1-9]\d\})\??)"
_RE_ATOM = rf"(?:{_RE_LITERAL}|{_RE_ESCAPE}|{_RE_CLASS}|\.)"


def _regex_format(depth: int = 2) -> str:
    seq = rf"(?:{_RE_ATOM}{_RE_QUANT}?)+"
    for _ in range(depth):
        group = rf"\((?:\?:)?{seq}(?:\|{seq})*\)"
        seq = rf"(?:(?:{_RE_ATOM}|{group}){_RE_QUANT}?)+"
    return rf"\^?(?:{seq}(?:\|{seq})*)?\$?"


FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "duration": _DURATION,
    "email": r"[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "idn-email": r"[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "hostname": _HOST,
    # IDNA: lower case, and no "--" (positions 3-4 are reserved for xn-- labels)
    "idn-hostname": r"[a-z0-9]{1,10}(?:-[a-z0-9]{1,10}){0,2}(?:\.[a-z0-9]{1,10}(?:-[a-z0-9]{1,10}){0,2}){0,4}\.[a-z]{2,10}",
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "ipv4": rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}",
    "ipv6": _ipv6(),
    "uri": _URI,
    "iri": _URI,
    "uri-reference": f"{_URI}|{_RELATIVE}",
    "iri-reference": f"{_URI}|{_RELATIVE}",
    "uri-template": _URI,            # a URI without braces is a (trivial) URI template
    "json-pointer": _POINTER,
    # no 0 digit after the first (jsonschema's checker rejects it), and something after the number
    "relative-json-pointer": r"(?:0|[1-9]{1,6})(?:#|(?:/(?:[A-Za-z0-9_.-]|~[01])*)+)",
    "regex": _regex_format(),
}

# Formats some drafts define and validators check, with no pattern here: refused by name.
REFUSED_FORMATS = frozenset({"color", "utc-millisec", "host-name", "ip-address"})
