"""Errors raised while compiling a JSON Schema into a grammar."""
from __future__ import annotations


class SchemaError(ValueError):
    """The schema is invalid, or no JSON document can satisfy it."""


class UnsupportedSchemaError(SchemaError):
    """The schema uses a keyword (or combination) this compiler does not implement.

    The message names the keyword and its location as a JSON pointer, e.g.
    ``unsupported keyword 'multipleOf' at /properties/n``.
    """


class SchemaTooLarge(SchemaError):
    """Compiling the schema would take more work than the limits allow. Never read as "this
    part admits nothing": it stops the whole compilation."""


def unsupported(keyword: str, pointer: str, why: str = "") -> UnsupportedSchemaError:
    where = pointer or "/"
    extra = f": {why}" if why else ""
    return UnsupportedSchemaError(f"unsupported keyword {keyword!r} at {where}{extra}")
