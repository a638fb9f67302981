"""One worker thread for the compiler: the C passes release the GIL, so on the largest schemas
independent work runs beside them (a second core's worth of compile time)."""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

_pool: tuple[int, ThreadPoolExecutor] | None = None


def submit(fn: Callable[..., T], *args) -> Future[T]:
    global _pool
    # Per process: a forked child inherits the executor but not its thread.
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar"))
    return _pool[1].submit(fn, *args)
