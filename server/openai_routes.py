"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Response and stream chunk shapes follow OpenAI's API so the official clients work unchanged.
Streams end with `data: [DONE]`; with stream_options.include_usage a last chunk carries usage
and no choices. A request that ends in an error mid-stream gets a `data: {"error": ...}`
chunk, which the OpenAI clients raise as an APIError. Finish reasons: "stop", or "length" for
both max_tokens and a full context. Responses also carry a non-standard `metrics` object.
Logprobs (when asked for, never with streaming) follow OpenAI's legacy completions format and
its chat format; see server/logprobs.py.
"""
from __future__ import annotations

import time
from typing import Any, AsyncIterator, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine import FinishReason, GenerationResult, RequestHandle
from server.context import ServerContext
from server import logprobs
from server.errors import NotFound
from server.generation import error_for_result, metrics_payload
from server.openai_schemas import parse_chat, parse_completion
from server.replies import reply
from server.spec import GenerationSpec
from server.sse import encode_event
from server.validation import read_json_object

COMPLETIONS, CHAT = "completions", "chat_completions"


async def list_models(request: Request, ctx: ServerContext) -> Response:
    model = ctx.require_model()
    return JSONResponse({"object": "list", "data": [_model_card(model.model_id, ctx)]})


async def get_model(request: Request, ctx: ServerContext) -> Response:
    model = ctx.require_model()
    name = request.path_params["model"]
    if not model.accepts_name(name):
        raise NotFound(f"model {name!r} is not served here; this server serves {model.model_id!r}",
                       param="model", code="model_not_found")
    return JSONResponse(_model_card(model.model_id, ctx))


def _model_card(model_id: str, ctx: ServerContext) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": int(ctx.state.started_wall), "owned_by": "cobatch"}


async def completions(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    parsed = parse_completion(body, n_ctx=engine.n_ctx)
    model_id = _check_model(parsed.model, ctx)
    handle, spec = await ctx.service.submit(lambda: parsed.spec, COMPLETIONS, "cmpl")
    shape = _Shape(kind="text_completion", request_id=f"cmpl-{handle.request_id}", model=model_id,
                   spec=spec, token_bytes=engine.model.token_bytes)
    return await _respond(request, ctx, handle, COMPLETIONS, parsed.spec.priority, parsed.spec.stream,
                          parsed.include_usage, shape)


async def chat_completions(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    parsed = parse_chat(body, n_ctx=engine.n_ctx)
    model_id = _check_model(parsed.model, ctx)
    chat = ctx.state.chat
    assert chat is not None
    # Rendering tokenizes, so it runs inside submit's worker thread.
    handle, spec = await ctx.service.submit(
        lambda: parsed.with_prompt(chat.render(parsed.messages)), CHAT, "chat"
    )
    shape = _Shape(kind="chat.completion", request_id=f"chatcmpl-{handle.request_id}", model=model_id,
                   spec=spec, token_bytes=engine.model.token_bytes)
    return await _respond(request, ctx, handle, CHAT, spec.priority, spec.stream, parsed.include_usage, shape)


def _check_model(name: str, ctx: ServerContext) -> str:
    model = ctx.require_model()
    if not model.accepts_name(name):
        raise NotFound(f"model {name!r} is not served here; this server serves {model.model_id!r}",
                       param="model", code="model_not_found")
    return model.model_id


class _Shape:
    """Builds OpenAI objects for one request: full responses and stream chunks."""

    def __init__(self, kind: str, request_id: str, model: str, spec: GenerationSpec | None = None,
                 token_bytes: Sequence[bytes] = ()) -> None:
        self.kind = kind
        self.spec = spec
        self.token_bytes = token_bytes
        self.chat = kind == "chat.completion"
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def response(self, result: GenerationResult) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": openai_finish_reason(result),
                                  "logprobs": self._logprobs(result)}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        payload = self._envelope(self.kind, [choice])
        payload["usage"] = usage(result)
        payload["metrics"] = metrics_payload(result)
        return payload

    def _logprobs(self, result: GenerationResult) -> dict[str, Any] | None:
        if self.spec is None or not self.spec.want_logprobs:
            return None
        build = logprobs.chat_logprobs if self.chat else logprobs.completion_logprobs
        return build(result, self.token_bytes, self.spec.logprobs)

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
            return self._envelope("chat.completion.chunk", [choice])
        choice["text"] = text or ""
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        payload = self._envelope(obj, [])
        payload["usage"] = usage(result)
        return payload


def openai_finish_reason(result: GenerationResult) -> str:
    return "length" if result.finish_reason in (FinishReason.LENGTH, FinishReason.CONTEXT_LENGTH) else "stop"


def usage(result: GenerationResult) -> dict[str, int]:
    m = result.metrics
    return {"prompt_tokens": m.prompt_tokens, "completion_tokens": m.tokens_generated,
            "total_tokens": m.prompt_tokens + m.tokens_generated}


async def _respond(
    request: Request, ctx: ServerContext, handle: RequestHandle, endpoint: str, priority: str,
    stream: bool, include_usage: bool, shape: _Shape,
) -> Response:
    return await reply(
        request, ctx, handle, endpoint=endpoint, priority=priority, stream=stream,
        events=lambda: _chunks(handle, shape, include_usage),
        error_event=lambda err: encode_event(err.body()) + encode_event("[DONE]"),
        payload=shape.response,
    )


async def _chunks(handle: RequestHandle, shape: _Shape, include_usage: bool) -> AsyncIterator[bytes]:
    if shape.chat:  # OpenAI opens a chat stream with the role and empty content
        yield encode_event(shape.chunk("", first=True))
    async for delta in handle:
        yield encode_event(shape.chunk(delta))
    result = await handle
    error = error_for_result(result)
    if error is not None:
        yield encode_event(error.body())
    else:
        yield encode_event(shape.chunk(None if shape.chat else "", openai_finish_reason(result)))
        if include_usage:
            yield encode_event(shape.usage_chunk(result))
    yield encode_event("[DONE]")
