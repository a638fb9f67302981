"""The base of every refusal, `RequestError`, and the one sampling raises: a bad parameter.

A refusal is raised before anything is queued, so it changes nothing else. The base lives here,
in sampling/, because sampling is the lowest layer that refuses requests (SamplingParams
validates itself) and engine/ imports sampling/, never the other way round; the engine's own
refusals are in engine/errors.py. `engine` re-exports them all; import them from there.
"""
from __future__ import annotations


class RequestError(Exception):
    """A request that cannot be served as asked; nothing else in the engine is affected."""


class InvalidParameterError(RequestError, ValueError):
    """A request parameter is out of range or of the wrong type; the message says which, and
    `field` names it (None when no single field is at fault). Also a ValueError, as callers
    validating arguments expect."""

    def __init__(self, message: str, field: str | None = None, needed_tokens: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.needed_tokens = needed_tokens  # max_tokens too small: the fewest that would do

    def __reduce__(self) -> tuple:  # keep the fields across pickling (Ray, multiprocessing)
        return (type(self), (str(self), self.field, self.needed_tokens))
