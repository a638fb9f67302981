"""Runs stored batch jobs through the server's own routes, a bounded number of requests at a time.

Each request goes to the route its line names, in process, at batch priority, so it is checked
and answered exactly as the same request sent over HTTP. The runner keeps at most
`in_flight_limit()` requests in the engine (enough to fill its running slots, never enough to
meet the queue's bound), and shares them among active jobs in turn: each round gives every job
with work one request, so a large job cannot starve a small one that came later.

A result is committed when it arrives. An answer that says "not now" (the server is loading or
draining, the queue is full) is not a result: the request stays pending and runs again after a
pause, in this process or after a restart. Nothing is sent while the server does not admit
requests, nor once the drain has begun.

A batch ends only when every request has exactly one outcome. Faults never lose a line:
- a store that cannot write (full disk, read-only, locked) pauses the jobs: nothing new is sent,
  results in hand wait in memory, and a probe write each round resumes them when it succeeds;
- a result the store refuses for another reason, or a request that raises, is tried again, and
  after MAX_ATTEMPTS becomes an error line saying why;
- one batch's failure (its input file, its output files) is that batch's alone: the others run on,
  and its finalize is retried with a growing delay, the reason shown in its `errors` and /health.
Every store call runs on the store thread, never on the event loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator

from server.jobs import input_file
from server.jobs.output_file import write_outputs
from server.jobs.store import (
    ACTIVE, ANONYMOUS, CANCELLED, CANCELLING, COMPLETED, EXPIRED, FINALIZING, IN_PROGRESS, VALIDATING, JobStore, Outcome,
    PendingRequest, store_unavailable,
)
from server.jobs.store_thread import StoreThread

log = logging.getLogger("cobatch.jobs")

# (url, body, owner=the batch's owner) -> the request's outcome, or None when the answer is
# "not now" (retry later). The owner makes the request count for the tenant that made the batch.
Execute = Callable[..., Awaitable[Outcome | None]]

MAX_ATTEMPTS = 3  # a request that raised, or a result the store refused, this often ends as an error line
_IDLE_POLL_S = 1.0  # expiry and retries are looked at within this
_PROBE_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # a paused store is probed after these delays, then every second
_NOT_NOW_PAUSE_S = 0.25  # after a "not now" answer, nothing is sent for this long
_FINALIZE_RETRY_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
_PAGE = 64  # pending requests read from the store at a time, per job


def in_flight_for(max_running: int) -> int:
    """Enough requests to keep every running slot busy, plus a few queued so a freed slot is
    refilled at the next step instead of after the runner hears of it."""
    return max_running + max(2, max_running // 4)


@dataclass
class _Job:
    batch_id: str
    endpoint: str
    owner: str = ANONYMOUS
    queued: deque[PendingRequest] = field(default_factory=deque)
    last_line: int = -1  # the last line read from the store
    exhausted: bool = False  # no pending line after last_line
    in_flight: dict[int, asyncio.Task] = field(default_factory=dict)
    unsaved: dict[int, tuple[PendingRequest, Outcome]] = field(default_factory=dict)  # results the store has not taken
    failures: dict[int, int] = field(default_factory=dict)  # per line: requests that raised, results refused
    closing: bool = False  # cancelled or expired: nothing more is sent

    def has_work(self) -> bool:
        return not self.closing and (bool(self.queued) or not self.exhausted)

    def holds(self, line: int) -> bool:
        """Whether the line is already in this runner's hands (queued, running or unsaved)."""
        return line in self.in_flight or line in self.unsaved or any(r.line == line for r in self.queued)


class JobRunner:
    def __init__(self, store: JobStore, execute: Execute, in_flight_limit: Callable[[], int], *,
                 db: StoreThread | None = None, can_submit: Callable[[], bool] = lambda: True) -> None:
        self.store = store
        self._db = db or StoreThread()
        self._owns_db = db is None
        self._execute = execute
        self._limit = in_flight_limit
        self._can_submit = can_submit
        self._jobs: dict[str, _Job] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._hold_until = 0.0
        self._finalize_failures: dict[str, tuple[int, float]] = {}  # batch id -> (failures, next try at)
        self.pause_reason: str | None = None  # why jobs are paused (the store cannot write), or None
        self._probes = 0  # failed probes since the pause began
        self.batch_problems: dict[str, str] = {}  # batch id -> why its files are not written yet
        self.results_recorded = 0  # this process's committed outcomes (tests count recomputation)
        self.in_flight_at_stop: int | None = None
        self.refused_after_stop = 0  # "not now" answers once the drain began (each stays pending)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    def begin_stop(self) -> None:
        """Send no more requests; those in flight end with the server's drain. Safe from a signal
        handler and more than once."""
        if self._stopping:
            return
        self._stopping = True
        self.in_flight_at_stop = self.in_flight
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    async def stop(self) -> None:
        self.begin_stop()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._owns_db:
            self._db.close()

    @property
    def in_flight(self) -> int:
        return sum(len(job.in_flight) for job in self._jobs.values())

    def health(self) -> dict[str, Any]:
        """What /health shows of the jobs (from memory: it never waits on the store)."""
        status = "stopped" if self._stopping else "paused" if self.pause_reason else "running"
        return {"status": status, "reason": self.pause_reason, "requests_in_flight": self.in_flight,
                "results_unsaved": sum(len(job.unsaved) for job in self._jobs.values()),
                "batches_retrying": dict(self.batch_problems)}

    def notes(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """Why an active batch is not moving, in the shape of OpenAI's batch errors (empty if it is)."""
        if batch["status"] not in ACTIVE:
            return []
        notes = []
        if self.pause_reason:
            notes.append({"code": "store_unavailable", "message": self.pause_reason, "param": None, "line": None})
        if batch["id"] in self.batch_problems:
            notes.append({"code": "finalize_retrying", "message": self.batch_problems[batch["id"]], "param": None,
                          "line": None})
        return notes

    # ---- the loop -----------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()  # before the round: a request ending during it wakes the next one
            try:
                await self._round()
            except Exception:  # each step guards its own batches; this is a last resort
                log.exception("batch job runner round failed; retrying")
            wait = _IDLE_POLL_S
            if self.pause_reason is not None:
                wait = _PROBE_S[min(self._probes, len(_PROBE_S) - 1)]
            elif self._hold_until > time.monotonic():
                wait = min(wait, self._hold_until - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
        tasks = [t for job in self._jobs.values() for t in job.in_flight.values()]
        await asyncio.gather(*tasks, return_exceptions=True)
        with self._guard("storing the last results"):
            await self._save_unsaved()
        log.info("batch jobs stopped: %s request(s) were in flight when the drain began; %d answered 'not now' "
                 "and stay pending", self.in_flight_at_stop, self.refused_after_stop)

    async def _round(self) -> None:
        if self.pause_reason is not None:
            try:
                await self._db(self.store.check_writable)
            except Exception as exc:
                if not store_unavailable(exc):
                    raise
                self._probes += 1
                self._pause(exc)
                return
            log.warning("batch jobs resume: the store takes writes again")
            self.pause_reason, self._probes = None, 0
        for step in (self._save_unsaved, self._validate_new, self._end_cancelled_and_expired, self._fill,
                     self._finalize_done):
            with self._guard(step.__name__.strip("_").replace("_", " ")):
                await step()

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """One batch's step: a store that cannot write pauses the jobs; any other failure is
        logged and the step runs again next round. Either way the other batches go on."""
        try:
            yield
        except Exception as exc:
            if store_unavailable(exc):
                self._pause(exc)
            else:
                log.exception("batch jobs: %s failed; trying again next round", what)

    def _pause(self, exc: BaseException) -> None:
        reason = (f"batch jobs are paused: the job store cannot write ({type(exc).__name__}: {exc}); "
                  "they resume when it can")
        if self.pause_reason is None:
            log.warning("%s", reason)
        self.pause_reason = reason

    # ---- validation ---------------------------------------------------------------------------
    async def _validate_new(self) -> None:
        for batch_id in await self._db(self.store.batch_ids, [VALIDATING]):
            with self._guard(f"validating {batch_id}"):
                await self._validate(batch_id)

    async def _validate(self, batch_id: str) -> None:
        batch = await self._db(self.store.batch_row, batch_id)
        path, endpoint = self.store.file_path(batch["input_file_id"]), batch["endpoint"]
        try:
            _, problems = await asyncio.to_thread(input_file.check_requests, path, endpoint)
        except FileNotFoundError:
            problems = [input_file.InputProblem("file_not_found", "the input file was deleted before the batch was "
                                                "validated")]
        except Exception as exc:
            if store_unavailable(exc):
                raise
            problems = [input_file.InputProblem("invalid_file", f"the input file could not be read: "
                                                f"{type(exc).__name__}: {exc}")]
        if not problems:
            requests = ((r.custom_id, r.body) for r in input_file.iter_requests(path, endpoint))
            try:
                await self._db(self.store.start, batch_id, requests)
                return
            except Exception as exc:
                if store_unavailable(exc):
                    raise
                problems = [input_file.InputProblem("invalid_file", f"the requests could not be stored: "
                                                    f"{type(exc).__name__}: {exc}")]
        await self._db(self.store.fail_validation, batch_id, [p.as_openai() for p in problems])

    # ---- ending ---------------------------------------------------------------------------------
    async def _end_cancelled_and_expired(self) -> None:
        now = time.time()
        for batch_id in await self._db(self.store.batch_ids, [IN_PROGRESS, CANCELLING]):
            with self._guard(f"ending {batch_id}"):
                batch = await self._db(self.store.batch_row, batch_id)
                if batch["status"] == CANCELLING:
                    final, code, why = CANCELLED, "batch_cancelled", "the batch was cancelled before this request ran"
                elif now >= batch["expires_at"]:
                    final, code, why = (EXPIRED, "batch_expired",
                                        "the batch's completion window ended before this request ran")
                else:
                    continue
                job = self._jobs.get(batch_id)
                if job is not None:
                    job.closing = True
                    job.queued.clear()
                    for task in job.in_flight.values():
                        task.cancel()  # cancelled in the engine too; nothing is recorded for them
                    if job.in_flight or job.unsaved:
                        continue  # ended in a later round, once they are out and stored
                await self._db(self.store.end_unfinished, batch_id, code, why)
                if await self._write_files(batch_id, final, only_from=(batch["status"],)):
                    self._jobs.pop(batch_id, None)

    async def _finalize_done(self) -> None:
        now = time.time()
        for batch_id in await self._db(self.store.batch_ids, [IN_PROGRESS]):
            job = self._jobs.get(batch_id)
            if job is None or job.closing or job.has_work() or job.in_flight or job.unsaved:
                continue
            with self._guard(f"finishing {batch_id}"):
                if now >= (await self._db(self.store.batch_row, batch_id))["expires_at"]:
                    continue  # it ends expired (_end_cancelled_and_expired), never completed
                if await self._db(self.store.unfinished, batch_id):
                    job.last_line, job.exhausted = -1, False  # lines passed over: read the batch again
                    continue
                await self._db(self.store.set_status, batch_id, FINALIZING, only_from=(IN_PROGRESS,))
                self._jobs.pop(batch_id)
        for batch_id in await self._db(self.store.batch_ids, [FINALIZING]):
            await self._write_files(batch_id, COMPLETED, only_from=(FINALIZING,))

    async def _write_files(self, batch_id: str, final: str, only_from: tuple[str, ...]) -> bool:
        """The output and error files, then the final status (a crash between the two only means
        the files are written again). False if it failed: it is tried again after a delay."""
        failures, next_try = self._finalize_failures.get(batch_id, (0, 0.0))
        if time.monotonic() < next_try:
            return False
        try:
            output_id, error_id = await asyncio.to_thread(write_outputs, self.store, batch_id)
            ended = await self._db(self.store.finish, batch_id, final, only_from, output_id, error_id)
        except Exception as exc:
            delay = _FINALIZE_RETRY_S[min(failures, len(_FINALIZE_RETRY_S) - 1)]
            self._finalize_failures[batch_id] = (failures + 1, time.monotonic() + delay)
            self.batch_problems[batch_id] = (f"the output files could not be written ({type(exc).__name__}: {exc}); "
                                             f"trying again in {delay:g} s")
            log.warning("batch %s: %s", batch_id, self.batch_problems[batch_id])
            return False
        self._finalize_failures.pop(batch_id, None)
        self.batch_problems.pop(batch_id, None)
        if not ended:
            log.warning("batch %s was not ended %s: a request still has no outcome", batch_id, final)
        return ended

    # ---- sending --------------------------------------------------------------------------------
    async def _fill(self) -> None:
        if (self._stopping or self.pause_reason or not self._can_submit()
                or time.monotonic() < self._hold_until):
            return
        now = time.time()
        for batch_id in await self._db(self.store.batch_ids, [IN_PROGRESS]):
            if batch_id not in self._jobs:
                with self._guard(f"opening {batch_id}"):
                    batch = await self._db(self.store.batch_row, batch_id)
                    if now < batch["expires_at"]:
                        self._jobs[batch_id] = _Job(batch_id, batch["endpoint"], batch["owner"])
        room = self._limit() - self.in_flight
        while room > 0 and not self._stopping and not self.pause_reason:
            progressed = False
            for job in list(self._jobs.values()):  # one each per round: jobs share the slots
                if room <= 0:
                    break
                request = None
                with self._guard(f"reading {job.batch_id}"):
                    request = await self._next(job)
                if request is None or job.closing or self._stopping:
                    continue
                job.in_flight[request.line] = asyncio.get_running_loop().create_task(self._one(job, request))
                room -= 1
                progressed = True
            if not progressed:
                break

    async def _next(self, job: _Job) -> PendingRequest | None:
        if job.closing:
            return None
        if not job.queued and not job.exhausted:
            page = await self._db(self.store.pending, job.batch_id, job.last_line, _PAGE)
            job.queued.extend(r for r in page if not job.holds(r.line))
            if page:
                job.last_line = page[-1].line
            job.exhausted = len(page) < _PAGE
        return job.queued.popleft() if job.queued else None

    async def _one(self, job: _Job, request: PendingRequest) -> None:
        try:
            if self._stopping:  # taken before the drain began and not sent yet: it stays pending
                return
            try:
                outcome = await self._execute(job.endpoint, request.body, owner=job.owner)
            except asyncio.CancelledError:
                return  # its batch was cancelled or expired: the request stays without an outcome
            except Exception as exc:
                log.exception("batch %s line %d failed to run", job.batch_id, request.line)
                outcome = self._failed_attempt(job, request.line, "request_failed",
                                               f"the request could not be run: {type(exc).__name__}: {exc}")
                if outcome is None:
                    job.queued.append(request)
                    return
            if outcome is None:  # "not now"
                if self._stopping:
                    self.refused_after_stop += 1  # stays pending: it runs after the restart
                else:
                    job.queued.appendleft(request)
                    self._hold_until = time.monotonic() + _NOT_NOW_PAUSE_S
                return
            await self._save(job, request, outcome)
        finally:
            job.in_flight.pop(request.line, None)
            self._wake.set()

    def _failed_attempt(self, job: _Job, line: int, code: str, message: str) -> Outcome | None:
        """Count a failure of the line; None while it may be tried again, else its error outcome."""
        job.failures[line] = job.failures.get(line, 0) + 1
        if job.failures[line] < MAX_ATTEMPTS:
            return None
        return Outcome(None, error={"code": code, "message": f"{message} (after {MAX_ATTEMPTS} attempts)"})

    async def _save(self, job: _Job, request: PendingRequest, outcome: Outcome) -> None:
        try:
            stored = await self._db(self.store.record, job.batch_id, request.line, outcome)
        except Exception as exc:
            if store_unavailable(exc):
                self._pause(exc)
            else:
                log.exception("batch %s line %d: the result could not be stored", job.batch_id, request.line)
                substitute = self._failed_attempt(job, request.line, "result_not_stored",
                                                  f"the result could not be stored: {type(exc).__name__}: {exc}")
                outcome = substitute or outcome
            job.unsaved[request.line] = (request, outcome)  # stored by a later round
            return
        job.unsaved.pop(request.line, None)
        if stored:
            self.results_recorded += 1

    async def _save_unsaved(self) -> None:
        for job in list(self._jobs.values()):
            for request, outcome in list(job.unsaved.values()):
                if self.pause_reason is not None:
                    return
                await self._save(job, request, outcome)
