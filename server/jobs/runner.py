"""Runs stored batch jobs through the server's own routes, a bounded number of requests at a time.

Each request goes to the route its line names, in process, at batch priority, so it is checked
and answered exactly as the same request sent over HTTP. The runner keeps at most
`in_flight_limit()` requests in the engine (enough to fill its running slots, never enough to
meet the queue's bound), and shares them among active jobs in turn: each round gives every job
with work one request, so a large job cannot starve a small one that came later.

A result is committed when it arrives. An answer that says "not now" (the server is draining,
the queue is full) is not a result: the request stays pending and runs again, in this process
or after a restart. After a restart every job resumes where its committed results end.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Awaitable, Callable

from server.jobs import input_file
from server.jobs.output_file import write_outputs
from server.jobs.store import (
    CANCELLED, CANCELLING, COMPLETED, EXPIRED, FINALIZING, IN_PROGRESS, VALIDATING, JobStore, Outcome, PendingRequest,
)

log = logging.getLogger("cobatch.jobs")

# (url, body) -> the request's outcome, or None when the answer is "not now" (retry later).
Execute = Callable[[str, dict[str, Any]], Awaitable[Outcome | None]]

_IDLE_POLL_S = 1.0  # expiry and retries are noticed within this
_PAGE = 64  # pending requests read from the store at a time, per job


def in_flight_for(max_running: int) -> int:
    """Enough requests to keep every running slot busy, plus a few queued so a freed slot is
    refilled at the next step instead of after the runner hears of it."""
    return max_running + max(2, max_running // 4)


class _Job:
    def __init__(self, batch_id: str, endpoint: str) -> None:
        self.batch_id = batch_id
        self.endpoint = endpoint
        self.queued: deque[PendingRequest] = deque()
        self.last_line = -1  # the last line read from the store
        self.exhausted = False  # no pending line after last_line
        self.in_flight: dict[int, asyncio.Task] = {}
        self.closing = False  # cancelled or expired: nothing more is sent

    def has_work(self) -> bool:
        return not self.closing and (bool(self.queued) or not self.exhausted)


class JobRunner:
    def __init__(self, store: JobStore, execute: Execute, in_flight_limit: Callable[[], int]) -> None:
        self.store = store
        self._execute = execute
        self._limit = in_flight_limit
        self._jobs: dict[str, _Job] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.results_recorded = 0  # this process's committed outcomes (tests count recomputation)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    def begin_stop(self) -> None:
        """Send no more requests; those in flight end with the server's drain."""
        self._stopping = True
        self._wake.set()

    async def stop(self) -> None:
        self.begin_stop()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def in_flight(self) -> int:
        return sum(len(job.in_flight) for job in self._jobs.values())

    # ---- the loop -----------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._validate_new()
                await self._end_cancelled_and_expired()
                self._fill()
                await self._finalize_done()
            except Exception:
                log.exception("batch job runner step failed; retrying")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), _IDLE_POLL_S)
            except asyncio.TimeoutError:
                pass
        tasks = [t for job in self._jobs.values() for t in job.in_flight.values()]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _validate_new(self) -> None:
        for batch_id in self.store.batch_ids([VALIDATING]):
            batch = self.store.batch_row(batch_id)
            path = self.store.file_path(batch["input_file_id"])
            try:
                requests, problems = await asyncio.to_thread(input_file.read_requests, path, batch["endpoint"])
            except FileNotFoundError:
                requests, problems = [], [input_file.InputProblem("file_not_found", "the input file was deleted "
                                                                  "before the batch was validated")]
            if problems:
                self.store.fail_validation(batch_id, [p.as_openai() for p in problems])
            else:
                await asyncio.to_thread(self.store.start, batch_id, [(r.custom_id, r.body) for r in requests])

    async def _end_cancelled_and_expired(self) -> None:
        now = time.time()
        for batch_id in self.store.batch_ids([IN_PROGRESS, CANCELLING]):
            batch = self.store.batch_row(batch_id)
            if batch["status"] == CANCELLING:
                final, code, why = CANCELLED, "batch_cancelled", "the batch was cancelled before this request ran"
            elif now >= batch["expires_at"]:
                final, code, why = EXPIRED, "batch_expired", "the batch's completion window ended before this request ran"
            else:
                continue
            job = self._jobs.get(batch_id)
            if job is not None and job.in_flight:
                job.closing = True
                for task in job.in_flight.values():
                    task.cancel()  # cancelled in the engine too; nothing is recorded for them
                continue  # ended next round, once they are out
            self._jobs.pop(batch_id, None)
            self.store.end_unfinished(batch_id, code, why)
            await self._write_files(batch_id, final, only_from=(batch["status"],))

    def _fill(self) -> None:
        for batch_id in self.store.batch_ids([IN_PROGRESS]):
            if batch_id not in self._jobs:
                self._jobs[batch_id] = _Job(batch_id, self.store.batch_row(batch_id)["endpoint"])
        room = self._limit() - self.in_flight
        while room > 0 and not self._stopping:
            progressed = False
            for job in list(self._jobs.values()):  # one each per round: jobs share the slots
                if room <= 0:
                    break
                request = self._next(job)
                if request is None:
                    continue
                job.in_flight[request.line] = asyncio.get_running_loop().create_task(self._one(job, request))
                room -= 1
                progressed = True
            if not progressed:
                break

    def _next(self, job: _Job) -> PendingRequest | None:
        if job.closing:
            return None
        if not job.queued and not job.exhausted:
            page = self.store.pending(job.batch_id, job.last_line, _PAGE)
            job.queued.extend(r for r in page if r.line not in job.in_flight)
            if page:
                job.last_line = page[-1].line
            job.exhausted = len(page) < _PAGE
        return job.queued.popleft() if job.queued else None

    async def _one(self, job: _Job, request: PendingRequest) -> None:
        try:
            outcome = await self._execute(job.endpoint, request.body)
            if outcome is not None and self.store.record(job.batch_id, request.line, outcome):
                self.results_recorded += 1
            elif outcome is None and not self._stopping:
                job.queued.append(request)  # "not now": it runs again later
        except asyncio.CancelledError:
            pass  # its batch was cancelled: the request stays without an outcome
        except Exception:
            log.exception("batch %s line %d failed to run; it stays pending", job.batch_id, request.line)
        finally:
            job.in_flight.pop(request.line, None)
            self._wake.set()

    async def _finalize_done(self) -> None:
        for batch_id in self.store.batch_ids([IN_PROGRESS]):
            job = self._jobs.get(batch_id)
            if job is not None and not job.has_work() and not job.in_flight:
                self._jobs.pop(batch_id)
                self.store.set_status(batch_id, FINALIZING, only_from=(IN_PROGRESS,))
        for batch_id in self.store.batch_ids([FINALIZING]):
            await self._write_files(batch_id, COMPLETED, only_from=(FINALIZING,))

    async def _write_files(self, batch_id: str, final: str, only_from: tuple[str, ...]) -> None:
        """The output and error files, then the final status: a crash between the two only
        means the files are written again."""
        output_id, error_id = await asyncio.to_thread(write_outputs, self.store, batch_id)
        self.store.set_status(batch_id, final, only_from=only_from, output_file_id=output_id, error_file_id=error_id)
