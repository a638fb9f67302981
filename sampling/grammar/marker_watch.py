"""Where a marker string first appears in generated text, followed token by token.

Tool calls under `auto` for a family that writes text before its calls (trigger.py): the calls'
grammar starts where the text first holds the marker (`<tool_call>`), which may end inside a
token (`>\\n` after `<tool_call`). The marker's automaton (Knuth-Morris-Pratt) has one state per
marker byte matched; per state, the few tokens that would complete the marker are listed once per
vocabulary, with what of each comes after the marker, so a step checks only those.
"""
from __future__ import annotations

import numpy as np

from .vocab_index import VocabIndex


def transitions(marker: bytes) -> np.ndarray:
    """int table [state, byte] -> next state; state len(marker) means the marker is complete."""
    m = len(marker)
    table = np.zeros((m + 1, 256), dtype=np.int32)
    table[0, marker[0]] = 1
    fallback = 0  # the state the text would be in without its first byte
    for state in range(1, m + 1):
        table[state] = table[fallback]
        if state < m:
            table[state, marker[state]] = state + 1
            fallback = int(table[fallback, marker[state]])
    return table


class MarkerWatch:
    def __init__(self, marker: bytes, idx: VocabIndex) -> None:
        if not marker:
            raise ValueError("an empty marker")
        self.marker = marker
        self._table = idx.derived(("marker_table", marker), lambda: transitions(marker))
        # Per state: token -> its bytes after the marker's end, for the tokens that complete it.
        self.completing: tuple[dict[int, bytes], ...] = idx.derived(
            ("marker_completing", marker), lambda: _completing(self._table, marker, idx))

    def run(self, state: int, data: bytes) -> tuple[int, int | None]:
        """(the state after `data`, the offset in `data` just past the marker's first completion,
        None if it does not complete)."""
        return _run(self._table, len(self.marker), state, data)


def _run(table: np.ndarray, m: int, state: int, data: bytes) -> tuple[int, int | None]:
    for i, byte in enumerate(data):
        state = int(table[state, byte])
        if state == m:
            return state, i + 1
    return state, None


def _completing(table: np.ndarray, marker: bytes, idx: VocabIndex) -> tuple[dict[int, bytes], ...]:
    m, last = len(marker), marker[-1]
    per_state: list[dict[int, bytes]] = [{} for _ in range(m)]
    for token, data in enumerate(idx.token_bytes):
        if last not in data:  # the marker completes on its last byte
            continue
        for start in range(m):
            _, end = _run(table, m, start, data)
            if end is not None:
                per_state[start][token] = data[end:]
    return tuple(per_state)
