"""How every generation route ends, once its requests are queued (one per choice): stream the
answer as SSE, or wait for the results and answer them (or nothing, to a client that left); and
what every answer shows of a finished request, whatever its dialect: the HTTP error for one that
ended without an answer, and the non-standard `metrics` object."""
from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine import FinishReason, GenerationResult, RequestHandle
from server.auth import caller_of
from server.context import ServerContext
from server.error_shapes import error_response
from server.errors import CLIENT_CLOSED_REQUEST, APIError, GatewayTimeout, InternalError, ServiceUnavailable
from server.sse import EventStreamResponse
from server.tool_reader import Text, ToolOutputReader


async def reply(
    request: Request,
    ctx: ServerContext,
    handles: list[RequestHandle],
    *,
    request_id: str,
    endpoint: str,
    priority: str,
    stream: bool,
    events: Callable[[], AsyncIterator[bytes]],
    error_event: Callable[[APIError], bytes],
    payload: Callable[[list[GenerationResult]], dict[str, Any] | Awaitable[dict[str, Any]]],
    headers: dict[str, str] | None = None,
) -> Response:
    """`events` makes this API's SSE body and `error_event` its in-stream error; `payload` is the
    JSON answer to results that have one (the first error_for_result answers the others), or an
    awaitable of it (an answer that is stored before it is sent).
    `request_id` is sent as the x-request-id header, with `headers` (the tenant's rate limits)."""
    headers = {**(headers or {}), "x-request-id": request_id}
    if stream:
        def left() -> None:
            for handle in handles:
                ctx.service.client_left(handle, endpoint, priority)

        return EventStreamResponse(_cancel_if_abandoned(handles, events()), on_disconnect=left,
                                   error_event=error_event, headers=headers)
    results = await ctx.service.wait(handles, request.receive, endpoint, priority)
    if results is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is listening; uvicorn drops it
    for result in results:
        error = error_for_result(result)
        if error is not None:
            error.headers.update(headers)
            return error_response(error, request.scope)
    body = payload(results)
    if inspect.isawaitable(body):
        body = await body
    return JSONResponse(body, headers=headers)


async def read_pieces(handles: list[RequestHandle], reader: ToolOutputReader | None) -> AsyncIterator[Any]:
    """The choices' text as the tool reader's pieces (all plain Text without a reader), then each
    choice's GenerationResult: the dialects that stream calls as blocks or items read this."""
    async for _, item in merged_deltas(handles):
        if isinstance(item, str):
            for piece in [Text(item)] if reader is None else reader.feed(item):
                yield piece
        else:
            for piece in [] if reader is None else reader.flush():  # text held while it could open calls
                yield piece
            yield item


async def merged_deltas(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, str | GenerationResult]]:
    """(choice index, text delta) as each arrives, whichever choice it belongs to, then
    (index, result) once per choice as it finishes."""
    if len(handles) == 1:  # the common case, without a queue between
        async for delta in handles[0]:
            yield 0, delta
        yield 0, await handles[0]
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, handle: RequestHandle) -> None:
        async for delta in handle:
            await queue.put((i, delta))
        await queue.put((i, await handle))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    try:
        for _ in handles:  # until every choice has finished
            while True:
                i, item = await queue.get()
                yield i, item
                if isinstance(item, GenerationResult):
                    break
    finally:
        for task in tasks:
            task.cancel()


async def _cancel_if_abandoned(handles: list[RequestHandle], events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in events:
            yield chunk
    finally:
        for handle in handles:
            if not handle.done():  # the stream was abandoned: don't leave the request running
                handle.cancel()


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


async def reply_in_dialect(request: Request, ctx: ServerContext, spec: Any, endpoint: str, id_prefix: str,
                           rename: Callable[[APIError], APIError],
                           make_answer: Callable[[str, list[RequestHandle]], Any]) -> Response:
    """Submit one chat spec for a dialect's route (Messages, Responses) and answer in its shape:
    an engine refusal speaks the dialect's field names (`rename`), and `make_answer(id, handles)`
    gives the answer with its `stream`, `error_event` and `payload` (the JSON answer)."""
    try:
        submitted = await ctx.service.submit([spec], endpoint, id_prefix, caller_of(request))
    except APIError as exc:  # the engine's refusal of a tool grammar names the chat fields
        raise rename(exc) from None
    handles = submitted.handles
    answer = make_answer(submitted.id, handles)
    return await reply(
        request, ctx, handles, request_id=submitted.id, endpoint=endpoint, priority=spec.priority,
        stream=spec.stream, events=lambda: answer.stream(handles), error_event=answer.error_event,
        payload=answer.payload, headers=submitted.headers,
    )
