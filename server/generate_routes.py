"""`POST /generate`: the native API. JSON in, JSON out, or SSE with `"stream": true`.

Streaming events:
  event: delta   data: {"text": "<new text>"}                       one per text delta
  event: done    data: {"text", "finish_reason", "metrics", ...}     last event on success
  event: error   data: {"error": {...}, "finish_reason", "metrics"}  last event on failure
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from engine import GenerationResult, RequestHandle
from server import logprobs, structured
from server.context import ServerContext
from server.engine_protocol import ServedEngine
from server.generation import error_for_result, metrics_payload
from server.replies import reply
from server.schemas import parse_generate
from server.spec import GenerationSpec
from server.sse import encode_event
from server.validation import read_json_object

ENDPOINT = "generate"


async def generate(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    spec = parse_generate(body, n_ctx=engine.n_ctx)
    ((handle, _),) = await ctx.service.submit(lambda: [spec], ENDPOINT, "gen")
    return await reply(
        request, ctx, [handle], endpoint=ENDPOINT, priority=spec.priority, stream=spec.stream,
        events=lambda: _events(handle, spec, engine),
        error_event=lambda err: encode_event(err.body(), event="error"),
        payload=lambda results: _final_payload(results[0], spec, engine),
    )


def _final_payload(result: GenerationResult, spec: GenerationSpec, engine: ServedEngine) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": result.request_id,
        "text": result.text,
        "finish_reason": result.finish_reason.value,
        "metrics": metrics_payload(result),
    }
    if spec.structured is not None:
        payload["structured_data"] = structured.structured_data(result)
    if spec.want_logprobs:
        payload["logprobs"] = logprobs.generate_logprobs(result, engine.model.token_bytes, spec.logprobs)
    return payload


async def _events(handle: RequestHandle, spec: GenerationSpec, engine: ServedEngine) -> AsyncIterator[bytes]:
    async for delta in handle:
        yield encode_event({"text": delta}, event="delta")
    result = await handle
    error = error_for_result(result)
    if error is None:
        yield encode_event(_final_payload(result, spec, engine), event="done")
    else:
        body = error.body()
        body.update(finish_reason=result.finish_reason.value, metrics=metrics_payload(result))
        yield encode_event(body, event="error")
