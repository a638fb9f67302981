"""With `engine_nice`, the engine thread and the ggml threads it starts run at that much more nice
than the process's other threads (Linux), so a short piece of other work (the first-token lane's
prompt, the HTTP loop) gets a core first instead of an even split with a decode step."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from engine import Engine, EngineConfig, Request

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_the_engine_and_its_ggml_threads_run_nicer_than_the_lane_and_the_caller(model_path):
    base = _nice(threading.get_native_id())
    before = set(map(int, os.listdir("/proc/self/task")))
    with Engine(model_path, n_ctx=1024, max_running=4, n_threads=2, engine_nice=7, speculative=False) as engine:
        engine.submit(Request(prompt="Count to three.", max_tokens=4)).result(timeout=60)
        engine_tid = engine._loop._thread.native_id
        lane_tid = engine._lane._thread.native_id
        expected = min(19, base + 7)
        assert _nice(engine_tid) == expected
        assert _nice(lane_tid) == base
        # ggml's OpenMP worker, started by the engine thread for its first two-thread step, inherits it.
        python = {t.native_id for t in threading.enumerate()}
        started = set(map(int, os.listdir("/proc/self/task"))) - before - python
        assert any(_nice(tid) == expected for tid in started)


def test_by_default_every_thread_keeps_the_process_nice(engine):
    engine.submit(Request(prompt="Count to three.", max_tokens=4)).result(timeout=60)
    assert EngineConfig().engine_nice == 0
    assert _nice(engine._loop._thread.native_id) == _nice(threading.get_native_id())


def test_engine_nice_is_checked():
    with pytest.raises(ValueError, match="engine_nice"):
        EngineConfig(engine_nice=20)
    with pytest.raises(ValueError, match="engine_nice"):
        EngineConfig(engine_nice=-1)
