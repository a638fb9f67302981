"""How every generation route ends, once its request is queued: stream the answer as SSE, or
wait for the result and answer it (or nothing, to a client that left)."""
from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine import GenerationResult, RequestHandle
from server.context import ServerContext
from server.errors import CLIENT_CLOSED_REQUEST, APIError
from server.generation import error_for_result
from server.sse import EventStreamResponse


async def reply(
    request: Request,
    ctx: ServerContext,
    handle: RequestHandle,
    *,
    endpoint: str,
    priority: str,
    stream: bool,
    events: Callable[[], AsyncIterator[bytes]],
    error_event: Callable[[APIError], bytes],
    payload: Callable[[GenerationResult], dict[str, Any]],
) -> Response:
    """`events` makes this API's SSE body and `error_event` its in-stream error; `payload` is the
    JSON answer to a result that has one (error_for_result's error answers the others)."""
    headers = {"x-request-id": handle.request_id}
    if stream:
        return EventStreamResponse(
            _cancel_if_abandoned(handle, events()),
            on_disconnect=lambda: ctx.service.client_left(handle, endpoint, priority),
            error_event=error_event,
            headers=headers,
        )
    result = await ctx.service.wait(handle, request.receive, endpoint, priority)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is listening; uvicorn drops it
    error = error_for_result(result)
    if error is not None:
        error.headers.update(headers)
        return error.response()
    return JSONResponse(payload(result), headers=headers)


async def _cancel_if_abandoned(handle: RequestHandle, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in events:
            yield chunk
    finally:
        if not handle.done():  # the stream was abandoned: don't leave the request running
            handle.cancel()
