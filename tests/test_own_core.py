"""While the first-token lane computes a prompt, its thread has a core of its own and every other
thread of the process runs on the other cores; after, each thread has its own cores back."""
from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from engine import Engine
from engine.first_token_lane import FirstTokenLane
from engine.own_core import OwnCore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                                reason="thread affinity on Linux, two cores at least")


class _Parked:
    """A thread that waits until told, so its affinity can be read and set meanwhile."""

    def __init__(self, cpus: set[int] | None = None) -> None:
        self.ready, self.go = threading.Event(), threading.Event()
        self.cpus = cpus
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)
        self.ready.set()
        self.go.wait(30)

    def affinity(self) -> set[int]:
        return os.sched_getaffinity(self.thread.native_id)

    def stop(self) -> None:
        self.go.set()
        self.thread.join(10)


def test_the_holder_gets_a_core_the_others_do_not_and_all_get_theirs_back():
    cpus = os.sched_getaffinity(0)
    core = max(cpus)
    narrow = {min(cpus), core}
    wide, narrowed = _Parked(), _Parked(narrow)
    try:
        own = OwnCore()
        assert own.enabled
        with own.held():
            assert os.sched_getaffinity(0) == {core}
            assert wide.affinity() == cpus - {core}
            assert narrowed.affinity() == cpus - {core}
            started = _Parked()  # inherits the holder's single core while held
            assert started.affinity() == {core}
        assert os.sched_getaffinity(0) == cpus
        assert wide.affinity() == cpus
        assert narrowed.affinity() == narrow  # its own set, not every core
        assert started.affinity() == cpus
        started.stop()
    finally:
        wide.stop()
        narrowed.stop()


def test_one_core_is_nothing_to_share():
    own = OwnCore(frozenset({0}))
    assert not own.enabled
    before = os.sched_getaffinity(0)
    with own.held():
        assert os.sched_getaffinity(0) == before


@pytest.mark.model
def test_the_lane_computes_its_prompt_on_a_core_of_its_own(model_path, monkeypatch):
    seen: list[tuple[set[int], set[int]]] = []
    engine_tid: list[int] = []
    make_lane = FirstTokenLane.__init__

    def watched(self, *args, **kwargs):
        make_lane(self, *args, **kwargs)
        decode = self._context.decode

        def decode_watched(batch):  # the lane thread's cores, and the engine thread's, as it computes
            seen.append((os.sched_getaffinity(0), os.sched_getaffinity(engine_tid[0])))
            return decode(batch)
        self._context.decode = decode_watched

    monkeypatch.setattr(FirstTokenLane, "__init__", watched)
    cpus = os.sched_getaffinity(0)
    with Engine(model_path, n_ctx=4096, max_running=16, n_threads=2, flash_attn=True,
                first_token_lane_tokens=32) as engine:
        engine_tid.append(engine._loop._thread.native_id)
        flood = engine.submit_many([f"Tell a long story about ship number {i}." for i in range(6)],
                                   max_tokens=96, ignore_eos=True)
        while not all(h.streamed_text() for h in flood):  # decode steps, which the lane runs beside
            time.sleep(0.001)
        chat = engine.submit("Question: What is the capital of France?\nAnswer:", max_tokens=4,
                             priority="interactive").result(timeout=60)
        for h in flood:
            h.result(timeout=60)
    assert chat.metrics.first_token_from_lane and len(chat.token_ids) == 4
    (lane, engine_thread), = seen
    assert len(lane) == 1 and engine_thread == cpus - lane
    assert all(os.sched_getaffinity(int(t)) == cpus for t in os.listdir("/proc/self/task"))  # given back
