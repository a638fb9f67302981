"""Submitting a validated request to the engine and following it to the end from asyncio.

Shared by every generation route: admission, engine errors → HTTP errors, accounting of each
finished request (metrics, drain tracking), and waiting for a result while watching the ASGI
receive channel, so a client that hangs up cancels its request instead of leaving it running.
"""
from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import Any, Awaitable, Callable

from engine import (
    EngineClosedError,
    FinishReason,
    GenerationResult,
    InvalidParameterError,
    PromptTooLongError,
    QueueFullError,
    Request,
    RequestError,
    RequestHandle,
)
from server.errors import (
    APIError,
    BadRequest,
    GatewayTimeout,
    InternalError,
    ServiceUnavailable,
    TooManyRequests,
)
from server.engine_protocol import ServedEngine
from server.metrics import ServerMetrics
from server.spec import GenerationSpec
from server.state import ServingState

log = logging.getLogger("cobatch.server")

Receive = Callable[[], Awaitable[dict]]

# Seconds a client should wait before retrying a full queue: about one short request's worth.
QUEUE_FULL_RETRY_AFTER_S = 1


class GenerationService:
    def __init__(self, state: ServingState, metrics: ServerMetrics) -> None:
        self.state = state
        self.metrics = metrics
        self._accounting: set[asyncio.Task] = set()

    async def submit(
        self, prepare: Callable[[], list[GenerationSpec]], endpoint: str, id_prefix: str
    ) -> list[tuple[RequestHandle, GenerationSpec]]:
        """Build the specs (one per choice) and queue them all, or raise the APIError that says
        why not (nothing is queued then). Runs on a worker thread: tokenizing a long prompt takes
        milliseconds per 10 kB and must not stall the event loop that streams everyone else's tokens."""
        future = asyncio.get_running_loop().run_in_executor(None, self._submit_blocking, prepare, id_prefix)
        try:
            submitted = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._abandon)  # cancelled mid-submit: don't leave them running
            raise
        for handle, spec in submitted:
            task = asyncio.get_running_loop().create_task(self._account(handle, endpoint, spec.priority))
            self._accounting.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._accounting.discard)
        return submitted

    def _abandon(self, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is None:
            for handle, _ in future.result():
                handle.cancel()
                self.state.untrack(handle)

    def _submit_blocking(
        self, prepare: Callable[[], list[GenerationSpec]], id_prefix: str
    ) -> list[tuple[RequestHandle, GenerationSpec]]:
        with self.state.admit() as engine:
            specs = prepare()
            base = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
            ids = [base] if len(specs) == 1 else [f"{base}-{i}" for i in range(len(specs))]
            handles = submit_all(engine, [spec.request(i) for spec, i in zip(specs, ids)], specs)
            for handle in handles:
                self.state.track(handle)
            return list(zip(handles, specs))

    async def _account(self, handle: RequestHandle, endpoint: str, priority: str) -> None:
        try:
            result = await handle
            self.metrics.observe_result(endpoint, priority, result)
        except asyncio.CancelledError:
            handle.cancel()
            raise
        except Exception:
            log.exception("accounting for %s failed", handle.request_id)
        finally:
            self.state.untrack(handle)

    async def wait(self, handles: list[RequestHandle], receive: Receive, endpoint: str,
                   priority: str) -> list[GenerationResult] | None:
        """Every result, or None if the client disconnected first (its requests are then cancelled)."""
        results_task = asyncio.ensure_future(asyncio.gather(*(_result_of(h) for h in handles)))
        disconnect_task = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            done, _ = await asyncio.wait({results_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
            if results_task in done:
                return results_task.result()
            for handle in handles:
                handle.cancel()
                self.metrics.observe_disconnect(endpoint, priority)
            return None
        finally:
            disconnect_task.cancel()
            if not results_task.done():
                for handle in handles:
                    handle.cancel()  # client gone, or this task was cancelled (forced shutdown)
                results_task.cancel()

    def client_left(self, handle: RequestHandle, endpoint: str, priority: str) -> None:
        if not handle.done():
            handle.cancel()
            self.metrics.observe_disconnect(endpoint, priority)


def submit_all(engine: ServedEngine, requests: list[Request], specs: list[GenerationSpec]) -> list[RequestHandle]:
    """All queued, or none (the first refusal is raised as its HTTP error)."""
    try:
        if len(requests) == 1:
            return [engine.submit(requests[0])]
        return engine.submit_many(requests)
    except RequestError as exc:
        raise refusal_error(exc, specs[0]) from None


def refusal_error(exc: RequestError, spec: GenerationSpec) -> APIError:
    """The HTTP error for each of the engine's refusals (engine.REFUSALS)."""
    if isinstance(exc, PromptTooLongError):
        return BadRequest(str(exc), param="prompt", code="context_length_exceeded")
    if isinstance(exc, InvalidParameterError):
        if spec.calls_tools:
            return tools_refusal(exc, spec)
        return BadRequest(str(exc), param=_param_of(exc, spec))
    if isinstance(exc, QueueFullError):
        return TooManyRequests(f"the request queue is full ({exc}); retry later", code="queue_full",
                               headers={"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)})
    if isinstance(exc, EngineClosedError):
        return ServiceUnavailable(str(exc), code="engine_closed")
    raise TypeError(f"no HTTP status for the refusal {type(exc).__name__}: add it here") from exc


def _param_of(exc: InvalidParameterError, spec: GenerationSpec) -> str | None:
    """The request field an engine InvalidParameterError is about, as the client named it."""
    if exc.field == "json_schema" and spec.structured is not None and spec.structured.source == "response_format":
        return "response_format"  # the OpenAI routes' name for the schema
    return exc.field


def tools_refusal(exc: InvalidParameterError, spec: GenerationSpec) -> APIError:
    """The engine's refusal of a calls grammar, in the request's own terms."""
    assert spec.tools is not None
    if exc.field == "max_tokens":
        needed = "more" if exc.needed_tokens is None else exc.needed_tokens
        return BadRequest(f"max_tokens={spec.max_tokens} is below the shortest possible tool call here, which needs "
                          f"{needed} tokens", param="max_tokens")
    if exc.field == "json_schema":
        message = str(exc).removeprefix("json_schema: ")
        for pointer in re.findall(r"/[^\s:,]*", message):
            found = spec.tools.parameters_param(pointer)
            if found is not None:  # a keyword inside one function's parameters
                param, rest = found
                message = message.replace(pointer, rest)
                return BadRequest(f"'{param}' cannot be compiled into a grammar: {message} (a JSON pointer "
                                  "within the parameters)", param=param)
        return BadRequest(f"'tools' cannot be compiled into a grammar: {message}", param="tools")
    return BadRequest(str(exc), param=exc.field)


async def _result_of(handle: RequestHandle) -> GenerationResult:
    return await handle


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the ASGI server reports the client gone. The body has been read already,
    so the only message still to come is http.disconnect."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def error_for_result(result: GenerationResult) -> APIError | None:
    """The HTTP error for a request that ended without a usable answer (None if it has one)."""
    reason = result.finish_reason
    if reason is FinishReason.ERROR:
        return InternalError(f"generation failed: {result.error or 'unknown engine error'}", code="generation_failed")
    if reason is FinishReason.CANCELLED:
        detail = f" ({result.error})" if result.error else ""
        return ServiceUnavailable(
            f"the request was cancelled before it finished because the server is shutting down{detail}",
            code="cancelled",
        )
    if reason is FinishReason.TIMEOUT:
        return GatewayTimeout(f"the request timed out: {result.error or 'deadline passed'}", code="timeout")
    return None


def metrics_payload(result: GenerationResult) -> dict[str, Any]:
    m = result.metrics
    return {
        "latency_ms": m.latency_ms,
        "tokens_per_second": m.tokens_per_second,
        "queue_time_ms": m.queue_time_ms,
        "ttft_ms": m.ttft_ms,
        "generation_time_ms": m.generation_time_ms,
        "prompt_tokens": m.prompt_tokens,
        "tokens_generated": m.tokens_generated,
        "cached_tokens": m.cached_tokens,
        "forced_tokens": m.forced_tokens,
        "drafted_tokens": m.drafted_tokens,
        "accepted_tokens": m.accepted_tokens,
    }
