"""The batch job store and runner without a model: a fake route answers each request, so every
path of a job (validation, fair sharing, retries, cancel, expiry, restart) runs in milliseconds."""
from __future__ import annotations

import asyncio
import json

import pytest

from server.jobs.input_file import read_requests
from server.jobs.runner import JobRunner
from server.jobs.store import JobStore, Outcome

ENDPOINT = "/v1/completions"


def _line(custom_id: str, prompt: str = "hi", **extra) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": {"prompt": prompt, **extra}}


def _upload(store: JobStore, lines: list) -> str:
    data = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()
    return store.add_file("batch", "in.jsonl", [data]).id


class FakeRoute:
    """Answers 200 with the prompt echoed; `refuse` prompts get a 400, `later` ones "not now" once."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.later_once: set[str] = set()

    async def __call__(self, url: str, body: dict, owner: str = "anonymous"):
        prompt = body["prompt"]
        self.calls.append(prompt)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if prompt.startswith("refuse"):
            return Outcome(400, "r-x", {"error": {"message": "no", "type": "invalid_request_error"}})
        if prompt.startswith("later") and prompt not in self.later_once:
            self.later_once.add(prompt)
            return None
        return Outcome(200, f"r-{prompt}", {"choices": [{"text": prompt}], "priority": body.get("priority")})


async def _run_until(runner: JobRunner, store: JobStore, batch_id: str, statuses, timeout: float = 10.0) -> dict:
    runner.wake()
    deadline = asyncio.get_running_loop().time() + timeout
    while (batch := store.batch(batch_id))["status"] not in statuses:
        assert asyncio.get_running_loop().time() < deadline, batch
        await asyncio.sleep(0.01)
    return batch


def _output_lines(store: JobStore, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in store.file_path(file_id).read_text().splitlines()]


def test_a_job_runs_every_line_once_and_sorts_answers_into_output_and_error_files(tmp_path):
    async def main():
        store = JobStore(tmp_path)
        route = FakeRoute(delay=0.001)
        runner = JobRunner(store, route, lambda: 4)
        runner.start()
        lines = [_line(f"c{i}", f"p{i}") for i in range(30)] + [_line("bad", "refuse-me"), _line("slow", "later-1")]
        batch_id = store.add_batch(ENDPOINT, _upload(store, lines), 3600, "24h", {"team": "a"})
        batch = await _run_until(runner, store, batch_id, {"completed"})
        await runner.stop()
        return store, route, batch

    store, route, batch = asyncio.run(main())
    assert batch["request_counts"] == {"total": 32, "completed": 31, "failed": 1}
    assert batch["metadata"] == {"team": "a"} and batch["completed_at"] >= batch["in_progress_at"]
    ok, failed = _output_lines(store, batch["output_file_id"]), _output_lines(store, batch["error_file_id"])
    assert sorted(x["custom_id"] for x in ok + failed) == sorted([f"c{i}" for i in range(30)] + ["bad", "slow"])
    assert failed[0]["custom_id"] == "bad" and failed[0]["response"]["status_code"] == 400
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in ok)
    assert route.most_in_flight <= 4
    assert route.calls.count("later-1") == 2  # "not now" ran again; everything else once
    assert len(route.calls) == 33


def test_structural_problems_fail_validation_with_openai_errors(tmp_path):
    async def main():
        store = JobStore(tmp_path)
        runner = JobRunner(store, FakeRoute(), lambda: 4)
        runner.start()
        lines = [_line("a"), "{not json", _line("a"), {**_line("b"), "url": "/v1/embeddings"}, {"method": "POST"}]
        batch_id = store.add_batch(ENDPOINT, _upload(store, lines), 3600, "24h", None)
        empty_id = store.add_batch(ENDPOINT, _upload(store, []), 3600, "24h", None)
        batch = await _run_until(runner, store, batch_id, {"failed"})
        empty = await _run_until(runner, store, empty_id, {"failed"})
        await runner.stop()
        return batch, empty

    batch, empty = asyncio.run(main())
    codes = [(e["code"], e["line"]) for e in batch["errors"]["data"]]
    assert codes == [("invalid_json_line", 2), ("duplicate_custom_id", 3), ("invalid_url", 4),
                     ("missing_required_parameter", 5)]
    assert batch["errors"]["object"] == "list" and batch["request_counts"]["total"] == 0
    assert [e["code"] for e in empty["errors"]["data"]] == ["empty_file"]


def test_jobs_share_the_slots_in_turn(tmp_path):
    async def main():
        store = JobStore(tmp_path)
        route = FakeRoute(delay=0.005)
        runner = JobRunner(store, route, lambda: 2)
        big = store.add_batch(ENDPOINT, _upload(store, [_line(f"b{i}", f"big{i}") for i in range(20)]), 3600, "24h", None)
        small = store.add_batch(ENDPOINT, _upload(store, [_line(f"s{i}", f"small{i}") for i in range(4)]), 3600, "24h",
                                None)
        runner.start()
        await _run_until(runner, store, small, {"completed"})
        await _run_until(runner, store, big, {"completed"})
        await runner.stop()
        return route.calls

    calls = asyncio.run(main())
    last_small = max(i for i, c in enumerate(calls) if c.startswith("small"))
    assert last_small < 10  # the small job did not wait for the big one's 20 requests


def test_cancel_keeps_what_finished_and_ends_the_rest_as_errors(tmp_path):
    async def main():
        store = JobStore(tmp_path)
        route = FakeRoute(delay=0.02)
        runner = JobRunner(store, route, lambda: 2)
        runner.start()
        batch_id = store.add_batch(ENDPOINT, _upload(store, [_line(f"c{i}", f"p{i}") for i in range(40)]), 3600, "24h",
                                   None)
        await _run_until(runner, store, batch_id, {"in_progress"})
        while store.counts(batch_id)["completed"] < 3:
            await asyncio.sleep(0.01)
        assert store.set_status(batch_id, "cancelling", only_from=("validating", "in_progress"))
        batch = await _run_until(runner, store, batch_id, {"cancelled"})
        calls = len(route.calls)
        await asyncio.sleep(0.1)
        await runner.stop()
        return store, batch, calls, len(route.calls)

    store, batch, calls_at_cancel, calls_later = asyncio.run(main())
    counts = batch["request_counts"]
    assert counts["total"] == 40 and counts["completed"] >= 3 and counts["completed"] + counts["failed"] == 40
    assert calls_later == calls_at_cancel  # nothing ran after the cancel
    failed = _output_lines(store, batch["error_file_id"])
    assert failed and all(x["error"]["code"] == "batch_cancelled" and x["response"] is None for x in failed)
    assert len(_output_lines(store, batch["output_file_id"])) == counts["completed"]


def test_a_restarted_runner_resumes_without_recomputing(tmp_path):
    lines = [_line(f"c{i}", f"p{i}") for i in range(24)]

    async def first():
        store = JobStore(tmp_path)
        route = FakeRoute(delay=0.01)
        runner = JobRunner(store, route, lambda: 3)
        runner.start()
        batch_id = store.add_batch(ENDPOINT, _upload(store, lines), 3600, "24h", None)
        while store.counts(batch_id)["completed"] < 8:
            await asyncio.sleep(0.005)
        runner._task.cancel()  # as abrupt as the process dying: in-flight answers are lost
        for job in runner._jobs.values():
            for task in job.in_flight.values():
                task.cancel()
        store.close()
        return batch_id

    batch_id = asyncio.run(first())

    async def second():
        store = JobStore(tmp_path)
        done_before = store.counts(batch_id)["completed"]
        route = FakeRoute()
        runner = JobRunner(store, route, lambda: 3)
        runner.start()
        batch = await _run_until(runner, store, batch_id, {"completed"})
        await runner.stop()
        return store, batch, done_before, route.calls

    store, batch, done_before, calls = asyncio.run(second())
    assert len(calls) == 24 - done_before  # finished results were not run again
    out = _output_lines(store, batch["output_file_id"])
    assert sorted(x["custom_id"] for x in out) == sorted(f"c{i}" for i in range(24))


def test_expired_batches_end_with_their_unrun_requests_as_errors(tmp_path):
    async def main():
        store = JobStore(tmp_path)
        runner = JobRunner(store, FakeRoute(delay=0.05), lambda: 1)
        batch_id = store.add_batch(ENDPOINT, _upload(store, [_line(f"c{i}") for i in range(5)]), 0, "24h", None)
        runner.start()
        batch = await _run_until(runner, store, batch_id, {"expired"})
        await runner.stop()
        return store, batch

    store, batch = asyncio.run(main())
    assert batch["request_counts"]["failed"] == 5
    assert {x["error"]["code"] for x in _output_lines(store, batch["error_file_id"])} == {"batch_expired"}


def test_offline_input_may_mix_endpoints_but_a_server_batch_may_not(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(_line("a")) + "\n" + json.dumps({**_line("b"), "url": "/v1/chat/completions"}) + "\n")
    requests, problems = read_requests(path, None)
    assert [r.url for r in requests] == [ENDPOINT, "/v1/chat/completions"] and not problems
    _, problems = read_requests(path, ENDPOINT)
    assert [p.code for p in problems] == ["invalid_url"]


def test_a_file_cut_off_mid_upload_leaves_nothing_on_disk(tmp_path):
    store = JobStore(tmp_path)

    def chunks():
        yield b'{"custom_id": "a"}\n'
        raise ValueError("the upload passed its limit")

    with pytest.raises(ValueError):
        store.add_file("batch", "in.jsonl", chunks())
    assert list(store.files_dir.iterdir()) == [] and store.files(None) == []
