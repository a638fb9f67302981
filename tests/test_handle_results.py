"""RequestHandle.on_result (engine/handle.py): what must be settled before anyone learns a
request has ended runs first, once, on the publishing thread."""
from __future__ import annotations

import threading

from engine.handle import RequestHandle
from engine.request import FinishReason, GenerationResult, RequestMetrics


def result_of(handle: RequestHandle) -> GenerationResult:
    return GenerationResult(handle.request_id, "done", (), FinishReason.LENGTH, RequestMetrics(1, 1, 0.0, 1.0, 1.0, 1.0, 1.0))


def test_callbacks_run_before_the_result_is_visible_and_once():
    handle = RequestHandle("r", 3, lambda _: None)
    seen: list[tuple[str, bool, str]] = []
    handle.on_result(lambda r: seen.append(("first", handle.done(), threading.current_thread().name)))
    handle.on_result(lambda r: 1 / 0)  # a failing callback is logged; the others and the result go on
    handle.on_result(lambda r: seen.append(("second", handle.done(), threading.current_thread().name)))
    publisher = threading.Thread(target=lambda: (handle.publish_result(result_of(handle)),
                                                 handle.publish_result(result_of(handle))), name="engine")
    publisher.start()
    publisher.join()
    assert seen == [("first", False, "engine"), ("second", False, "engine")]
    assert handle.result(timeout=1).text == "done"
    late: list[str] = []
    handle.on_result(lambda r: late.append(r.text))  # already published: called at once, here
    assert late == ["done"]
