"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Response and stream chunk shapes follow OpenAI's API so the official clients work unchanged.
Streams end with `data: [DONE]`; with stream_options.include_usage a last chunk carries usage
and no choices. A request that ends in an error mid-stream gets a `data: {"error": ...}`
chunk, which the OpenAI clients raise as an APIError. Finish reasons: "stop", or "length" for
both max_tokens and a full context, or "tool_calls" when (and only when) the message carries
complete calls, each valid against its function's parameters (server/tool_reader.py reads them,
streamed or not, so streamed argument fragments join into exactly the non-streamed text).
Responses also carry a non-standard `metrics` object.
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
from server.replies import merged_deltas, reply
from server.spec import GenerationSpec
from server.sse import encode_event
from server.tool_reader import Arguments, CallStart, Text, ToolOutputReader
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
    submitted = await ctx.service.submit(lambda: parsed.specs, COMPLETIONS, "cmpl")
    handles, specs = [h for h, _ in submitted], [s for _, s in submitted]
    shape = _Shape(kind="text_completion", request_id=f"cmpl-{handles[0].request_id}", model=model_id,
                   specs=specs, token_bytes=engine.model.token_bytes, n=parsed.n)
    return await _respond(request, ctx, handles, COMPLETIONS, specs[0].priority, specs[0].stream,
                          parsed.include_usage, shape)


async def chat_completions(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    parsed = parse_chat(body, n_ctx=engine.n_ctx)
    model_id = _check_model(parsed.model, ctx)
    chat = ctx.state.chat
    assert chat is not None
    # Rendering tokenizes, so it runs inside submit's worker thread.
    submitted = await ctx.service.submit(lambda: parsed.with_prompt(chat.render(parsed.messages, parsed.tools)),
                                         CHAT, "chat")
    handles, specs = [h for h, _ in submitted], [s for _, s in submitted]
    shape = _Shape(kind="chat.completion", request_id=f"chatcmpl-{handles[0].request_id}", model=model_id,
                   specs=specs, token_bytes=engine.model.token_bytes, n=parsed.n)
    return await _respond(request, ctx, handles, CHAT, specs[0].priority, specs[0].stream, parsed.include_usage,
                          shape)


def _check_model(name: str, ctx: ServerContext) -> str:
    model = ctx.require_model()
    if not model.accepts_name(name):
        raise NotFound(f"model {name!r} is not served here; this server serves {model.model_id!r}",
                       param="model", code="model_not_found")
    return model.model_id


class _Shape:
    """Builds OpenAI objects for one request: full responses and stream chunks, a choice per spec."""

    def __init__(self, kind: str, request_id: str, model: str, specs: list[GenerationSpec] | None = None,
                 token_bytes: Sequence[bytes] = (), n: int = 1) -> None:
        self.kind = kind
        self.n = n  # choices per prompt: usage counts each prompt once
        self.specs = specs or []
        self.token_bytes = token_bytes
        self.chat = kind == "chat.completion"
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        # Chat whose output may call functions: one reader per choice.
        self.readers = [ToolOutputReader(spec.tools, "auto" if spec.may_answer_in_text else "calls")
                        for spec in self.specs if spec.calls_tools and spec.tools is not None]

    def _envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def response(self, results: list[GenerationResult]) -> dict[str, Any]:
        choices = []
        for i, result in enumerate(results):
            choice: dict[str, Any] = {"index": i, "finish_reason": openai_finish_reason(result),
                                      "logprobs": self._logprobs(i, result)}
            if self.readers:
                self.readers[i].feed(result.text)
                choice["message"], choice["finish_reason"] = self.tool_message(i, result)
            elif self.chat:
                choice["message"] = {"role": "assistant", "content": result.text}
            else:
                choice["text"] = self.echoed(i) + result.text
            if len(results) > 1:
                choice["metrics"] = metrics_payload(result)
            choices.append(choice)
        payload = self._envelope(self.kind, choices)
        payload["usage"] = usage(results, self.n)
        if len(results) == 1:
            payload["metrics"] = metrics_payload(results[0])
        return payload

    def tool_message(self, i: int, result: GenerationResult) -> tuple[dict[str, Any], str]:
        """The message and finish reason of a choice read by readers[i] (fed all its text)."""
        reader = self.readers[i]
        calls = reader.finish(stopped=result.finish_reason is FinishReason.STOP)
        if calls is None:  # text, or (never in practice: the grammar closes in time) a call cut short
            content = None if reader.is_calls else reader.content()
            return {"role": "assistant", "content": content}, openai_finish_reason(result)
        tool_calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                      for c in calls]
        return {"role": "assistant", "content": None, "tool_calls": tool_calls}, "tool_calls"

    def tool_chunk(self, i: int, event: Text | CallStart | Arguments) -> dict[str, Any]:
        if isinstance(event, Text):
            return self.chunk(event.text, index=i)
        if isinstance(event, CallStart):
            call = {"index": event.index, "id": event.id, "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
        else:
            call = {"index": event.index, "function": {"arguments": event.fragment}}
        choice = {"index": i, "finish_reason": None, "logprobs": None, "delta": {"tool_calls": [call]}}
        return self._envelope("chat.completion.chunk", [choice])

    def _logprobs(self, i: int, result: GenerationResult) -> dict[str, Any] | None:
        if i >= len(self.specs) or not self.specs[i].want_logprobs:
            return None
        if self.chat:
            return logprobs.chat_logprobs(result, self.token_bytes, self.specs[i].logprobs)
        if self.specs[i].echo:
            return logprobs.echoed_completion_logprobs(result, self.token_bytes, self.specs[i].logprobs,
                                                       self.echoed(i))
        return logprobs.completion_logprobs(result, self.token_bytes, self.specs[i].logprobs)

    def echoed(self, i: int) -> str:
        """Choice i's prompt text when it asked for echo, else ""."""
        if self.chat or i >= len(self.specs) or not self.specs[i].echo:
            return ""
        return logprobs.echo_text(self.specs[i].prompt, self.token_bytes)

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False,
              index: int = 0) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
            return self._envelope("chat.completion.chunk", [choice])
        choice["text"] = text or ""
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, results: list[GenerationResult]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        payload = self._envelope(obj, [])
        payload["usage"] = usage(results, self.n)
        return payload


def openai_finish_reason(result: GenerationResult) -> str:
    return "length" if result.finish_reason in (FinishReason.LENGTH, FinishReason.CONTEXT_LENGTH) else "stop"


def usage(results: list[GenerationResult], n: int = 1) -> dict[str, Any]:
    """Each prompt counted once, however many choices (n) were drawn from it; cached_tokens: of
    those prompt tokens, the ones the prefix cache served."""
    prompt = sum(r.metrics.prompt_tokens for r in results[::n])
    # Forced tokens a grammar appends before the first step can be served from the cache too;
    # only the prompt's count here.
    cached = sum(min(r.metrics.cached_tokens, r.metrics.prompt_tokens) for r in results[::n])
    completion = sum(r.metrics.tokens_generated for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _respond(
    request: Request, ctx: ServerContext, handles: list[RequestHandle], endpoint: str, priority: str,
    stream: bool, include_usage: bool, shape: _Shape,
) -> Response:
    return await reply(
        request, ctx, handles, endpoint=endpoint, priority=priority, stream=stream,
        events=lambda: _chunks(handles, shape, include_usage),
        error_event=lambda err: encode_event(err.body()) + encode_event("[DONE]"),
        payload=shape.response,
    )


async def _chunks(handles: list[RequestHandle], shape: _Shape, include_usage: bool) -> AsyncIterator[bytes]:
    if shape.chat:  # OpenAI opens a chat stream with the role and empty content
        for i in range(len(handles)):
            yield encode_event(shape.chunk("", first=True, index=i))
    for i in range(len(handles)):  # echo: each choice's prompt comes first
        if shape.echoed(i):
            yield encode_event(shape.chunk(shape.echoed(i), index=i))
    results: list[GenerationResult | None] = [None] * len(handles)
    async for i, item in merged_deltas(handles):
        if isinstance(item, str):
            if shape.readers:
                for event in shape.readers[i].feed(item):
                    yield encode_event(shape.tool_chunk(i, event))
            else:
                yield encode_event(shape.chunk(item, index=i))
            continue
        results[i] = item
        error = error_for_result(item)
        if error is not None:
            yield encode_event(error.body())
            yield encode_event("[DONE]")
            return
        reason = shape.tool_message(i, item)[1] if shape.readers else openai_finish_reason(item)
        yield encode_event(shape.chunk(None if shape.chat else "", reason, index=i))
    if include_usage:
        yield encode_event(shape.usage_chunk([r for r in results if r is not None]))
    yield encode_event("[DONE]")
