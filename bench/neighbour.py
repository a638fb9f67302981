"""A busy process sharing the machine for the length of a measurement, and always stopped.

Modes: `none`; `nice19` and `nice0`, a plain child of the benchmark (same session); and
`nice19-session`, started in a session of its own. The last matters because this kernel groups
processes by session (`sched_autogroup_enabled`): nice ranks processes only within a group, so a
busy process from another session (another service, another login) competes at full weight
whatever its nice value.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator

MODES = ("none", "nice19", "nice19-session", "nice0")
_BUSY = "while True: pass"


@contextlib.contextmanager
def neighbour(mode: str) -> Iterator[subprocess.Popen | None]:
    if mode not in MODES:
        raise ValueError(f"unknown neighbour {mode!r}; choose among {', '.join(MODES)}")
    if mode == "none":
        yield None
        return
    nice = 0 if mode == "nice0" else 19
    process = subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", _BUSY],
                               start_new_session=mode == "nice19-session")
    try:
        yield process
    finally:
        process.kill()
        process.wait()
