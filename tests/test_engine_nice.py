"""The engine thread and the ggml threads it starts run at `engine_nice` more than the process's
other threads (Linux), so a short piece of other work (the first-token lane's prompt, the HTTP
loop) gets a core first instead of an even split with a decode step."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from engine import EngineConfig, Request

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_the_engine_and_its_ggml_threads_run_nicer_than_the_lane_and_the_caller(engine):
    engine.submit(Request(prompt="Count to three.", max_tokens=4)).result(timeout=60)
    base = _nice(threading.get_native_id())
    python_threads = {t.name: t.native_id for t in threading.enumerate()}
    expected = min(19, base + EngineConfig().engine_nice)
    assert EngineConfig().engine_nice > 0
    assert _nice(python_threads["cobatch-engine"]) == expected
    assert _nice(python_threads["cobatch-first-token"]) == base
    # ggml's OpenMP workers, started by the engine thread for its first two-thread step, inherit it.
    if engine.core.thread_governor.max_threads > 1:
        native = set(map(int, os.listdir("/proc/self/task"))) - set(python_threads.values())
        assert any(_nice(tid) == expected for tid in native)


def test_engine_nice_is_checked():
    with pytest.raises(ValueError, match="engine_nice"):
        EngineConfig(engine_nice=20)
    with pytest.raises(ValueError, match="engine_nice"):
        EngineConfig(engine_nice=-1)
