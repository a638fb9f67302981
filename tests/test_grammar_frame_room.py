"""frame_room: a deep recursion run through it does not map and unmap Python's frame stack at
every descent, whatever the caller's depth (the compiler's recursion on large schemas did)."""
from __future__ import annotations

import resource

import pytest

from sampling.grammar import frame_room


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _recurse(n: int) -> int:
    return 0 if n == 0 else 1 + _recurse(n - 1)


def _from_depth(n: int, fn):
    return fn() if n == 0 else _from_depth(n - 1, fn)


def _descents() -> int:
    """Page faults of 300 descents 200 frames deep."""
    before = _faults()
    for _ in range(300):
        _recurse(200)
    return _faults() - before


def test_deep_recursion_does_not_fault_at_any_caller_depth():
    faults = [_from_depth(d, lambda: frame_room.call(_descents)) for d in range(0, 200, 7)]
    assert max(faults) < 100, faults      # without it: 600 to 1,800 (CPython 3.11)


def test_call_returns_and_raises_as_the_function_does():
    assert frame_room.call(divmod, 7, 2) == (3, 1)
    with pytest.raises(ValueError):
        frame_room.call(int, "x")
