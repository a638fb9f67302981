"""The inbox's messages are typed: what client threads send and what the engine thread takes."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from engine import EngineClosedError, InvalidParameterError, Priority, QueueFullError
from engine.inbox import Adopt, Call, Cancel, CancelLive, Inbox, Submit
from engine.stats import EngineStats, StatsBoard, TierStats


def _seq(request_id: str, priority: Priority = Priority.BATCH) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, request=SimpleNamespace(priority=priority), finish_reason=None)


def _inbox(batch_bound: int = 4) -> Inbox:
    return Inbox({Priority.BATCH: batch_bound, Priority.INTERACTIVE: 2}, StatsBoard())


def test_messages_are_frozen_dataclasses():
    a, b = _seq("a"), _seq("b")
    for message in (Submit((a, b)), Cancel("a"), Call(lambda: 1), CancelLive(a)):
        assert dataclasses.is_dataclass(message)
        with pytest.raises(dataclasses.FrozenInstanceError):
            message.__setattr__(dataclasses.fields(message)[0].name, None)


def test_take_admits_submissions_and_returns_the_rest_in_order():
    inbox = _inbox()
    a, b = _seq("a"), _seq("b")
    inbox.submit([a, b])
    future = inbox.call(lambda: "ran")
    inbox.cancel("b")
    inbox.cancel("nobody")  # not live: dropped
    assert inbox._messages[0] == Submit((a, b)) and inbox._messages[-1] == Cancel("nobody")
    admitted = []
    rest = inbox.take(admitted.append)
    assert admitted == [a, b] and not inbox._messages
    assert [type(m) for m in rest] == [Call, CancelLive] and rest[1] == CancelLive(b)
    rest[0].run()
    assert future.result(0) == "ran"


def test_a_call_that_raises_hands_the_exception_to_its_future():
    inbox = _inbox()
    future = inbox.call(lambda: 1 / 0)
    [call] = inbox.take(lambda seq: None)
    call.run()
    with pytest.raises(ZeroDivisionError):
        future.result(0)


def test_refusals_change_nothing():
    inbox = _inbox(batch_bound=1)
    inbox.submit([_seq("a")])
    with pytest.raises(QueueFullError):
        inbox.submit([_seq("b")])
    with pytest.raises(InvalidParameterError, match="unique"):
        inbox.submit([_seq("a", Priority.INTERACTIVE)])
    inbox.close()
    with pytest.raises(EngineClosedError):
        inbox.submit([_seq("c", Priority.INTERACTIVE)])
    assert len(inbox._messages) == 1 and [s.request_id for s in inbox.live_sequences()] == ["a"]


def test_a_request_in_the_first_token_lane_reaches_the_engine_when_handed_over_cancel_after_it():
    inbox = _inbox()
    a, b = _seq("a", Priority.INTERACTIVE), _seq("b")
    inbox.submit([a], to_lane=a)
    assert not inbox._messages and [s.request_id for s in inbox.live_sequences()] == ["a"]
    inbox.cancel("a")
    admitted = []
    assert inbox.take(admitted.append) == [] and inbox._messages  # the cancel waits for the lane
    inbox.submit([b])
    inbox.hand_over(a, b"cells", None)
    rest = inbox.take(admitted.append)
    assert admitted == [b] and rest == [Adopt(a, b"cells", None), CancelLive(a)] and not inbox._messages


def _published(board: StatsBoard, waiting_batch: int) -> None:
    tiers = {p.value: TierStats(waiting=waiting_batch if p is Priority.BATCH else 0, running=0, admitted=0,
                                suspensions=0, preemptions=0, finished=0) for p in Priority}
    board.publish(EngineStats(running=0, waiting={}, kv_cells_used=0, kv_cells_total=0, kv=None, tokens_prefilled=0,
                              tokens_forced=0, suspensions=0, preemptions=0, steps=0, steps_interrupted=0, tiers=tiers))


def test_queue_bounds_count_the_published_queue_plus_what_was_taken_since():
    # The inbox never reads the scheduler: a request the engine took counts as queued until the
    # engine publishes its queues, and then the published count says where it is.
    board = StatsBoard()
    inbox = Inbox({Priority.BATCH: 2, Priority.INTERACTIVE: 2}, board)
    inbox.submit([_seq("a"), _seq("b")])
    inbox.take(lambda seq: None)
    with pytest.raises(QueueFullError):
        inbox.submit([_seq("c")])
    _published(board, waiting_batch=1)  # one of them started running
    inbox.submit([_seq("c")])
    with pytest.raises(QueueFullError):
        inbox.submit([_seq("d")])
    assert inbox.is_idle() is False
