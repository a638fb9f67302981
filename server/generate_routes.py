"""`POST /generate`: the native API. JSON in, JSON out, or SSE with `"stream": true`.

Streaming events:
  event: delta   data: {"text": "<new text>"}                       one per text delta
  event: done    data: {"text", "finish_reason", "metrics", ...}     last event on success
  event: error   data: {"error": {...}, "finish_reason", "metrics"}  last event on failure

With several choices (a list of prompts, or n > 1) the answer is {"id", "choices": [...]}, each
choice the single answer's fields plus its "index"; streamed, each delta carries its "index",
each finished choice is an `event: choice` with its fields, and `event: done` ends the stream
with {"choices": [...]}.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from engine import GenerationResult, RequestHandle
from server import logprobs, structured
from server.auth import caller_of
from server.context import ServerContext
from server.engine_protocol import ServedEngine
from server.replies import error_for_result, merged_deltas, metrics_payload, reply
from server.schemas import parse_generate
from server.spec import GenerationSpec
from server.sse import encode_event
from server.tiers import route_default
from server.validation import read_json_object

ENDPOINT = "generate"


async def generate(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    tier = route_default(ctx.settings.default_tier, ENDPOINT, caller_of(request).tenant.default_tier)
    specs = parse_generate(body, n_ctx=engine.n_ctx, tier=tier)
    submitted = await ctx.service.submit(specs, ENDPOINT, "gen-", caller_of(request))
    handles = submitted.handles
    # Its id is the engine's id of the (first) choice, as /generate has always given it.
    request_id = handles[0].request_id
    if len(handles) == 1:
        return await reply(
            request, ctx, handles, request_id=request_id, endpoint=ENDPOINT, priority=specs[0].priority,
            stream=specs[0].stream, events=lambda: _events(handles[0], specs[0], engine),
            error_event=lambda err: encode_event(err.body(), event="error"),
            payload=lambda results: _final_payload(results[0], specs[0], engine), headers=submitted.headers,
        )
    return await reply(
        request, ctx, handles, request_id=request_id, endpoint=ENDPOINT, priority=specs[0].priority,
        stream=specs[0].stream, events=lambda: _choice_events(handles, specs, engine),
        error_event=lambda err: encode_event(err.body(), event="error"),
        payload=lambda results: {"id": request_id,
                                 "choices": [_choice(i, r, specs[i], engine) for i, r in enumerate(results)]},
        headers=submitted.headers,
    )


def _choice(i: int, result: GenerationResult, spec: GenerationSpec, engine: ServedEngine) -> dict[str, Any]:
    payload = _final_payload(result, spec, engine)
    payload.pop("id")
    return {"index": i, **payload}


async def _choice_events(handles: list[RequestHandle], specs: list[GenerationSpec],
                         engine: ServedEngine) -> AsyncIterator[bytes]:
    choices: list[dict[str, Any]] = []
    async for i, item in merged_deltas(handles):
        if isinstance(item, str):
            yield encode_event({"index": i, "text": item}, event="delta")
            continue
        error = error_for_result(item)
        if error is not None:
            body = error.body()
            body.update(index=i, finish_reason=item.finish_reason.value, metrics=metrics_payload(item))
            yield encode_event(body, event="error")
            return
        choice = _choice(i, item, specs[i], engine)
        choices.append(choice)
        yield encode_event(choice, event="choice")
    yield encode_event({"id": handles[0].request_id, "choices": sorted(choices, key=lambda c: c["index"])},
                       event="done")


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
