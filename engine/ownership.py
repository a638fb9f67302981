"""Which thread may write an engine object; checked on every attribute write in debug mode.

The rule (docs/architecture.md, "Who may write what"): the engine thread alone writes the core
and everything it holds; a `Sequence` is written by one thread at a time, the one holding it
(the client thread that made it, then the engine thread, or the first-token lane's thread
between the two hand-overs); client threads read only immutable snapshots and send commands
through the inbox. Objects several threads call (the inbox, request handles, the interrupt
window, the lane's claim) guard their state with a lock and say so.

In debug mode (engine/debug.py) a write from any thread but the owner raises
`WrongThreadError`; otherwise the check costs nothing, because the base class then defines no
`__setattr__` at all.
"""
from __future__ import annotations

import collections
import threading

from engine.debug import ENABLED as CHECKING

# Every violation seen in this process, also when the exception was swallowed by a guard (the
# engine loop fails a request instead of dying): the test suite asserts this stays empty.
violations: list[str] = []


class WrongThreadError(AssertionError):
    """An object was written by a thread that does not own it."""


class SingleWriter:
    """An object written by one thread: the one that built it, until `claim` moves it."""

    if CHECKING:
        def __setattr__(self, name: str, value: object) -> None:
            owner = self.__dict__.get("_owner_thread")
            me = threading.get_ident()
            if owner is None:
                object.__setattr__(self, "_owner_thread", me)
            elif owner != me:
                message = (f"{type(self).__name__}.{name} written by thread {threading.current_thread().name!r}, "
                           f"which does not own it")
                violations.append(message)
                raise WrongThreadError(message)
            object.__setattr__(self, name, value)


def claim(*objects: SingleWriter) -> None:
    """The calling thread now owns these objects. Call it only where they are handed over (a
    thread's start, a queue taken under its lock), so the previous owner no longer writes them."""
    if CHECKING:
        me = threading.get_ident()
        for obj in objects:
            object.__setattr__(obj, "_owner_thread", me)


def claim_all(root: SingleWriter) -> None:
    """Claim `root` and every SingleWriter it holds, through attributes and containers."""
    if not CHECKING:
        return
    seen: set[int] = set()
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, SingleWriter):
            claim(obj)
            stack.extend(vars(obj).values())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            stack.extend(obj)
