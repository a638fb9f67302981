"""Room on Python's frame stack for the compiler's deep recursion.

CPython (3.11 on) keeps frames in chunks of 16 kB and unmaps a chunk as soon as the frame that
opened it returns. A recursion that keeps crossing a chunk's end, as the schema compiler does on
a large schema, maps and unmaps memory at each crossing: thousands of page faults, and each
unmapping stops the process's other threads. Whether that happens depended only on how deep the
caller's stack was. A call through a function with a large frame first opens one large chunk,
and the recursion runs in the room left above that frame.
"""
from __future__ import annotations

import types
from typing import Callable, TypeVar

T = TypeVar("T")

# Frame slots (8 bytes each) of the roomy call: its chunk is the next power of two above the
# frame, 256 kB, which leaves ~120 kB (thousands of frames) above it.
_SLOTS = 16_500


def _call(fn, args):
    return fn(*args)


# The same function with a larger evaluation stack declared: a larger frame, nothing else.
_roomy = types.FunctionType(_call.__code__.replace(co_stacksize=_SLOTS), globals(), "roomy")


def call(fn: Callable[..., T], *args) -> T:
    """fn(*args), with room for deep recursion on the frame stack."""
    return _roomy(fn, args)
