"""The compiled grammars kept for reuse, bounded by the memory they hold, not only by count: one
large schema's grammar holds more than a thousand small ones, and a grammar's caches grow as
requests use it."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable, Protocol


class Measured(Protocol):
    def nbytes(self) -> int: ...


class GrammarCache:
    """Least recently used out first, once the entries' estimated bytes exceed `max_bytes` or
    their number `max_entries`; the newest entry always stays. Thread-safe."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, Measured] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Measured | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(self, key: Hashable, value: Measured) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            # Sizes are taken now, not at insertion: grammars grow as they are used.
            sizes = [v.nbytes() for v in self._entries.values()]
            total = sum(sizes)
            for size in sizes[:-1]:
                if total <= self.max_bytes:
                    break
                self._entries.popitem(last=False)
                total -= size

    def nbytes(self) -> int:
        with self._lock:
            return sum(v.nbytes() for v in self._entries.values())
