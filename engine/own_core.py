"""A core of its own for a thread with a moment's work beside the engine's step (the first-token
lane's prompt): while it holds one, every other thread of the process is confined to the other
cores, and given back its own set of cores after.

At equal nice the kernel splits a core evenly between that thread and one of the step's ggml
threads, whose siblings then wait for it at every barrier, so the moment's work takes twice its
time. A higher nice for the engine would give the core up too, but would also rank the engine
below niced processes of its session for good (docs/threads.md); this lasts only while the work
does, and changes nothing against other processes. Linux; elsewhere, or with one core, a no-op.
"""
from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger("cobatch.engine")

_TASKS = "/proc/self/task"


class OwnCore:
    """One thread at a time (the lane's) holds it."""

    def __init__(self, cpus: frozenset[int] | None = None) -> None:
        usable = hasattr(os, "sched_setaffinity") and os.path.isdir(_TASKS)
        self._cpus = frozenset(cpus if cpus is not None else os.sched_getaffinity(0) if usable else ())
        self.enabled = usable and len(self._cpus) >= 2
        self._core = max(self._cpus, default=0)  # the holder's
        self._others = self._cpus - {self._core}

    @contextmanager
    def held(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        me = threading.get_native_id()
        before: dict[int, set[int]] = {}
        existing = _threads()
        try:
            for tid in existing:
                if tid != me:
                    try:
                        before[tid] = os.sched_getaffinity(tid)
                        os.sched_setaffinity(tid, self._others)
                    except ProcessLookupError:
                        continue  # it ended meanwhile
            before[me] = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {self._core})
        except OSError as exc:  # not allowed here (a sandbox's filter): serve without it
            self.enabled = False
            log.warning("the first-token lane cannot have a core of its own (%s): it shares them", exc)
        try:
            yield
        finally:
            self._give_back(before, set(existing))

    def _give_back(self, before: dict[int, set[int]], existing: set[int]) -> None:
        for tid in _threads():
            # A thread started meanwhile inherited its starter's confinement: it gets them all.
            cpus = before.get(tid) if tid in existing else self._cpus
            if cpus is not None:
                try:
                    os.sched_setaffinity(tid, cpus)
                except OSError:
                    pass  # ended meanwhile


def _threads() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_TASKS)]
    except OSError:
        return []
