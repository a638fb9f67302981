"""The engine's own refusals (a prompt too long, a full queue, a closing engine), and the list of
every refusal class.

They extend sampling/errors.py's `RequestError`, the base sampling's own refusal shares; `engine`
re-exports them all, so callers import every refusal from there.
"""
from __future__ import annotations

from sampling.errors import InvalidParameterError, RequestError


class PromptTooLongError(RequestError, ValueError):
    """The prompt does not fit the context with room for one generated token."""


class QueueFullError(RequestError):
    """The request's priority tier already has as many requests waiting as it may."""


class EngineClosedError(RequestError):
    """The engine is shutting down (or gone) and takes nothing new."""


# Every refusal class, by name: the one list the cluster sends across Ray and the server maps
# to HTTP statuses. A test checks it holds every RequestError subclass.
REFUSALS: dict[str, type[RequestError]] = {
    cls.__name__: cls for cls in (InvalidParameterError, PromptTooLongError, QueueFullError, EngineClosedError)
}
