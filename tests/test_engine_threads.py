"""Who may write what (engine/ownership.py), and an engine thread that survives its own failures.

The suite runs in debug mode (tests/conftest.py), so every engine test checks the ownership
rule; these tests show that a breach is caught, and that the loop fails only the request a
failure concerns and goes on serving the others.
"""
from __future__ import annotations

import threading

import pytest

from engine import FinishReason, Priority
from engine import ownership
from engine.core import EngineCore
from engine.ownership import WrongThreadError
from engine.request import Request
from tests.fake_backend import expected_tokens, fake_engine

PROMPT = [0, 5, 9, 12]


@pytest.fixture
def engine():
    engine, _ = fake_engine()
    yield engine
    engine.close()


def _breach(write) -> WrongThreadError:
    """Run a write that breaks the rule; the violation it records is this test's, not a failure."""
    seen = len(ownership.violations)
    with pytest.raises(WrongThreadError) as caught:
        write()
    assert len(ownership.violations) == seen + 1
    del ownership.violations[seen:]
    return caught.value


def test_the_suite_runs_with_the_checks_on():
    assert ownership.CHECKING


def test_a_client_thread_cannot_write_what_the_engine_thread_owns(engine):
    engine.generate([PROMPT], max_tokens=2)  # the engine thread has claimed the core by now
    scheduler = engine.core.scheduler
    error = _breach(lambda: setattr(scheduler, "max_running", 1))
    assert "Scheduler.max_running" in str(error) and scheduler.max_running == engine.config.max_running
    _breach(lambda: setattr(engine.core.kv_cache, "idle_drops", 7))
    _breach(lambda: setattr(engine.core.kv_cache.ledger, "n_blocks", 0))
    _breach(lambda: setattr(engine.core.scheduler.policy, "bounded_steps", 3))


def test_a_sequence_belongs_to_the_engine_thread_once_it_is_taken(engine):
    seq = engine._intake.sequence(PROMPT, {"max_tokens": 3})
    seq.n_computed = 0  # the client thread that made it may still write it
    engine._inbox.submit([seq])
    engine._loop.wake()
    assert seq.handle.result(10).finish_reason is FinishReason.LENGTH
    _breach(lambda: setattr(seq, "n_computed", 0))


def test_profiles_are_copied_and_reset_on_the_engine_thread(engine):
    engine.generate([PROMPT, PROMPT[:3]], max_tokens=4)
    first = engine.profile(reset=True)
    assert first["decode"].steps + first["mixed"].steps > 0
    assert engine.profile()["decode"].steps == engine.profile()["mixed"].steps == 0
    engine.generate([PROMPT], max_tokens=3)
    assert engine.profile()["decode"].steps + engine.profile()["mixed"].steps > 0


def test_is_idle_reads_the_registry_not_the_scheduler(engine):
    assert engine.is_idle()
    handle = engine.submit(PROMPT, max_tokens=50)
    assert not engine.is_idle()  # live from the moment it is submitted
    handle.result(10)
    assert engine.is_idle()


def test_a_request_whose_admission_fails_is_answered_and_the_engine_goes_on(engine, monkeypatch):
    real_add = EngineCore.add

    def add(core, seq):
        if seq.request_id == "doomed":
            raise RuntimeError("admission bug")
        real_add(core, seq)

    monkeypatch.setattr(EngineCore, "add", add)
    handles = engine.submit_many([Request(PROMPT, max_tokens=3, request_id="doomed"),
                                  Request(PROMPT[:3], max_tokens=3, request_id="fine")])
    doomed, fine = (h.result(10) for h in handles)
    assert doomed.finish_reason is FinishReason.ERROR and "admission bug" in doomed.error
    assert fine.finish_reason is FinishReason.LENGTH and list(fine.token_ids) == expected_tokens(PROMPT[:3], 3)
    assert engine.generate([PROMPT], max_tokens=2)[0].finish_reason is FinishReason.LENGTH
    assert engine.is_idle()


def test_a_failed_publish_fails_no_request_and_does_not_end_the_engine_thread(engine, monkeypatch):
    real_snapshot = EngineCore._snapshot
    failures = []

    def snapshot(core):
        if len(failures) < 3:
            failures.append(1)
            raise RuntimeError("publish bug")
        return real_snapshot(core)

    monkeypatch.setattr(EngineCore, "_snapshot", snapshot)
    engine._loop.wake()
    result = engine.generate([PROMPT], max_tokens=3)[0]
    assert result.finish_reason is FinishReason.LENGTH and len(failures) == 3
    assert engine._loop._thread.is_alive()


def test_a_failed_adoption_fails_that_request_and_keeps_the_rest(engine, monkeypatch):
    monkeypatch.setattr(EngineCore, "adopt", lambda core, seq, cells, reason, error=None: 1 / 0)
    seq = engine._intake.sequence(PROMPT, {"max_tokens": 3, "priority": Priority.INTERACTIVE})
    engine._inbox.submit([seq], to_lane=seq)  # as if the first-token lane held it
    engine._inbox.hand_over(seq, None, None)
    engine._loop.wake()
    result = seq.handle.result(10)
    assert result.finish_reason is FinishReason.ERROR and "ZeroDivisionError" in result.error
    assert engine.generate([PROMPT], max_tokens=2)[0].finish_reason is FinishReason.LENGTH


def test_a_client_thread_never_writes_a_sequence_it_handed_over(engine):
    # Submitting from many threads at once: every write the engine makes happens on its thread.
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(engine.generate([PROMPT[: 2 + i % 3]], max_tokens=5)))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r[0].finish_reason is FinishReason.LENGTH for r in results)
