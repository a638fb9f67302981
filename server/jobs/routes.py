"""OpenAI's Files and Batch routes over the job store: /v1/files and /v1/batches.

    POST   /v1/files                 multipart: purpose=batch, file=<JSONL>
    GET    /v1/files                 ?purpose=batch|batch_output
    GET    /v1/files/{id}            the file object
    GET    /v1/files/{id}/content    the bytes
    DELETE /v1/files/{id}
    POST   /v1/batches               {"input_file_id", "endpoint", "completion_window": "24h", "metadata"}
    GET    /v1/batches/{id}
    GET    /v1/batches               ?limit=20&after=<batch id>, newest first
    POST   /v1/batches/{id}/cancel

Files and batches belong to the caller that made them (server/auth.py's Caller): another caller's
are answered 404, as if they did not exist; an admin key sees all. Every store call runs on the
store thread.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from server.auth import caller_of
from server.errors import BadRequest, NotFound, PayloadTooLarge
from server.jobs.data_dir_lock import DataDirLock
from server.jobs.disk import write_whole
from server.jobs.in_process import InProcessRoutes
from server.jobs.input_file import ENDPOINTS
from server.jobs.runner import JobRunner
from server.jobs.store import CANCELLING, IN_PROGRESS, VALIDATING, JobStore, StoredFile, new_id
from server.jobs.store_thread import StoreThread
from server.validation import read_json_object

log = logging.getLogger("cobatch.jobs")

COMPLETION_WINDOWS = {"24h": 24 * 3600}  # the only window OpenAI accepts
_FORM_OVERHEAD = 64 * 1024  # multipart boundaries and headers around the file
_READ_CHUNK = 1 << 20


@dataclass
class Jobs:
    store: JobStore
    db: StoreThread
    runner: JobRunner
    routes: InProcessRoutes
    max_upload_bytes: int
    data_dir_lock: DataDirLock

    @classmethod
    def open(cls, data_dir: Path, app: Any, in_flight: int, max_upload_bytes: int,
             headers: dict[str, str] | None = None, can_submit: Callable[[], bool] = lambda: True) -> "Jobs":
        """Take the data directory (DataDirInUse if another process holds it), sweep what a crash
        left in it, and set up the store, its thread and the runner."""
        lock = DataDirLock(data_dir)
        try:
            store = JobStore(data_dir)
        except BaseException:
            lock.release()
            raise
        swept = store.sweep_files()
        if swept:
            log.info("removed %d file(s) no batch or upload owns: %s", len(swept), ", ".join(sorted(swept)[:10]))
        db = StoreThread()
        routes = InProcessRoutes(app, headers)
        runner = JobRunner(store, routes, lambda: in_flight, db=db, can_submit=can_submit)
        return cls(store, db, runner, routes, max_upload_bytes, lock)

    async def close(self) -> None:
        await self.runner.stop()
        await self.routes.close()
        await self.db(self.store.close)
        self.db.close()
        self.data_dir_lock.release()


def job_routes(jobs: Jobs, wrap: Callable[[Callable[[Request], Awaitable[Response]], str], Any]) -> list[Route]:
    """The routes, each passed through `wrap(handler, endpoint)` (the app's error handling)."""
    def route(path: str, handler: Callable[[Jobs, Request], Awaitable[Response]], method: str, name: str) -> Route:
        async def run(request: Request) -> Response:
            return await handler(jobs, request)

        return Route(path, wrap(run, name), methods=[method])

    return [
        route("/v1/files", upload_file, "POST", "files"),
        route("/v1/files", list_files, "GET", "files"),
        route("/v1/files/{file_id}", get_file, "GET", "files"),
        route("/v1/files/{file_id}", delete_file, "DELETE", "files"),
        route("/v1/files/{file_id}/content", file_content, "GET", "files"),
        route("/v1/batches", create_batch, "POST", "batches"),
        route("/v1/batches", list_batches, "GET", "batches"),
        route("/v1/batches/{batch_id}", get_batch, "GET", "batches"),
        route("/v1/batches/{batch_id}/cancel", cancel_batch, "POST", "batches"),
    ]


# ---- files ------------------------------------------------------------------------------------
async def upload_file(jobs: Jobs, request: Request) -> Response:
    limit = jobs.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + _FORM_OVERHEAD:
        raise PayloadTooLarge(f"the upload is {declared} bytes; files may hold at most {limit}", param="file",
                              code="file_too_large")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequest("upload a file as multipart/form-data with fields 'purpose' and 'file'")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as exc:  # the multipart parser's own errors: a malformed body
        raise BadRequest(f"the multipart body could not be read: {exc}") from None
    try:
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise BadRequest(f"purpose must be 'batch' (the only purpose this server stores), got {purpose!r}",
                             param="purpose")
        if not isinstance(upload, UploadFile):
            raise BadRequest("the form needs a 'file' part holding the JSONL", param="file")
        if upload.size is not None and upload.size > limit:
            raise PayloadTooLarge(f"the file is {upload.size} bytes; files may hold at most {limit}", param="file",
                                  code="file_too_large")
        file_id = new_id("file")
        # The bytes are copied on a worker thread of their own, the row is added on the store thread:
        # a large upload never holds up the jobs' results.
        size = await run_in_threadpool(write_whole, jobs.store.file_path(file_id), _read_all(upload.file, limit))
    finally:
        await form.close()
    stored = StoredFile(file_id, "batch", upload.filename or "upload.jsonl", size, int(time.time()),
                        caller_of(request).owner)
    try:
        await jobs.db(jobs.store.add_file_row, stored)
    except BaseException:
        jobs.store.file_path(file_id).unlink(missing_ok=True)  # no row will ever name it
        raise
    return JSONResponse(stored.as_openai())


def _read_all(handle: Any, limit: int) -> Any:
    size = 0
    while chunk := handle.read(_READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the file exceeds {limit} bytes", param="file", code="file_too_large")
        yield chunk


async def list_files(jobs: Jobs, request: Request) -> Response:
    purpose = request.query_params.get("purpose")
    files = await jobs.db(jobs.store.files, purpose, owner=caller_of(request).scope)
    return JSONResponse({"object": "list", "data": [f.as_openai() for f in files], "has_more": False})


async def _file_or_404(jobs: Jobs, request: Request, file_id: str) -> StoredFile:
    stored = await jobs.db(jobs.store.file, file_id, owner=caller_of(request).scope)
    if stored is None:
        raise NotFound(f"no file with id {file_id!r}", param="file_id", code="file_not_found")
    return stored


async def get_file(jobs: Jobs, request: Request) -> Response:
    return JSONResponse((await _file_or_404(jobs, request, request.path_params["file_id"])).as_openai())


async def file_content(jobs: Jobs, request: Request) -> Response:
    stored = await _file_or_404(jobs, request, request.path_params["file_id"])
    return FileResponse(jobs.store.file_path(stored.id), media_type="application/jsonl", filename=stored.filename)


async def delete_file(jobs: Jobs, request: Request) -> Response:
    file_id = request.path_params["file_id"]
    if not await jobs.db(jobs.store.delete_file, file_id, owner=caller_of(request).scope):
        raise NotFound(f"no file with id {file_id!r}", param="file_id", code="file_not_found")
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


# ---- batches ----------------------------------------------------------------------------------
async def create_batch(jobs: Jobs, request: Request) -> Response:
    body = await read_json_object(request, 64 * 1024)
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r}", param=unknown[0])
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise BadRequest("input_file_id is required: the id of an uploaded file", param="input_file_id")
    stored = await _file_or_404(jobs, request, file_id)
    if stored.purpose != "batch":
        raise BadRequest(f"file {file_id!r} has purpose {stored.purpose!r}; a batch reads a file uploaded with "
                         "purpose 'batch'", param="input_file_id")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}", param="endpoint")
    window = body.get("completion_window")
    if window not in COMPLETION_WINDOWS:
        raise BadRequest(f"completion_window must be '24h', got {window!r}", param="completion_window")
    metadata = _metadata(body.get("metadata"))
    batch_id = await jobs.db(jobs.store.add_batch, endpoint, file_id, COMPLETION_WINDOWS[window], window, metadata,
                             owner=caller_of(request).owner)
    jobs.runner.wake()
    return JSONResponse(await _batch_or_404(jobs, request, batch_id))


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if (not isinstance(value, dict) or len(value) > 16
            or not all(isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                       for k, v in value.items())):
        raise BadRequest("metadata must be an object of at most 16 string values (keys up to 64 characters, "
                         "values up to 512)", param="metadata")
    return value


def _shown(jobs: Jobs, batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with the runner's notes (a paused store, a finalize being retried) as its errors."""
    notes = jobs.runner.notes(batch)
    if notes and batch["errors"] is None:
        batch["errors"] = {"object": "list", "data": notes}
    return batch


async def _batch_or_404(jobs: Jobs, request: Request, batch_id: str) -> dict[str, Any]:
    batch = await jobs.db(jobs.store.batch, batch_id, owner=caller_of(request).scope)
    if batch is None:
        raise NotFound(f"no batch with id {batch_id!r}", param="batch_id", code="batch_not_found")
    return _shown(jobs, batch)


async def get_batch(jobs: Jobs, request: Request) -> Response:
    return JSONResponse(await _batch_or_404(jobs, request, request.path_params["batch_id"]))


async def list_batches(jobs: Jobs, request: Request) -> Response:
    raw_limit = request.query_params.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
        raise BadRequest(f"limit must be an integer from 1 to 100, got {raw_limit!r}", param="limit")
    after = request.query_params.get("after")
    if after is not None:
        await _batch_or_404(jobs, request, after)
    batches, more = await jobs.db(jobs.store.batches, int(raw_limit), after, owner=caller_of(request).scope)
    batches = [_shown(jobs, b) for b in batches]
    return JSONResponse({"object": "list", "data": batches, "first_id": batches[0]["id"] if batches else None,
                         "last_id": batches[-1]["id"] if batches else None, "has_more": more})


async def cancel_batch(jobs: Jobs, request: Request) -> Response:
    batch_id = request.path_params["batch_id"]
    await _batch_or_404(jobs, request, batch_id)
    if not await jobs.db(jobs.store.set_status, batch_id, CANCELLING, only_from=(VALIDATING, IN_PROGRESS)):
        batch = await _batch_or_404(jobs, request, batch_id)
        if batch["status"] != CANCELLING:  # cancelling twice is no error
            raise BadRequest(f"batch {batch_id!r} is {batch['status']} and cannot be cancelled", param="batch_id",
                             code="batch_not_cancellable")
    jobs.runner.wake()
    return JSONResponse(await _batch_or_404(jobs, request, batch_id))
