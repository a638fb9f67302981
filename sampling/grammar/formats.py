"""`format` values, each compiled as a `pattern` (a sound subset of what validators accept)."""
from __future__ import annotations

_DATE = (r"\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
         r"|02-(?:0[1-9]|1\d|2[0-8]))")  # 29 February is left out: leap years are not regular enough to bother
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_HEX = "[0-9a-fA-F]"

FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "email": r"[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "ipv4": rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}",
}
