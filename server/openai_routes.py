"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Each generation route is the same three steps: read the body into dialect-neutral specs
(server/openai_schemas.py), submit them under an id of OpenAI's form (`cmpl-…`, `chatcmpl-…`),
and answer in the route's own shape (server/openai_answers.py).
"""
from __future__ import annotations

from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.auth import caller_of
from server.context import ServerContext
from server.openai_answers import ChatAnswer, CompletionAnswer
from server.openai_schemas import OpenAIRequest, parse_chat, parse_completion
from server.replies import reply
from server.tiers import route_default
from server.validation import read_json_object

COMPLETIONS, CHAT = "completions", "chat_completions"


async def list_models(request: Request, ctx: ServerContext) -> Response:
    model = ctx.require_model()
    return JSONResponse({"object": "list", "data": [_model_card(model.model_id, ctx)]})


async def get_model(request: Request, ctx: ServerContext) -> Response:
    return JSONResponse(_model_card(ctx.served_model_id(request.path_params["model"]), ctx))


def _model_card(model_id: str, ctx: ServerContext) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": int(ctx.state.started_wall), "owned_by": "cobatch"}


async def completions(request: Request, ctx: ServerContext) -> Response:
    return await _generation(request, ctx, parse_completion, COMPLETIONS, "cmpl-", CompletionAnswer)


async def chat_completions(request: Request, ctx: ServerContext) -> Response:
    return await _generation(request, ctx, parse_chat, CHAT, "chatcmpl-", ChatAnswer)


async def _generation(request: Request, ctx: ServerContext, parse: Callable[..., OpenAIRequest], endpoint: str,
                      id_prefix: str, answer_class: type[CompletionAnswer] | type[ChatAnswer]) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    tier = route_default(ctx.settings.default_tier, endpoint, caller_of(request).tenant.default_tier)
    syntax = {"tool_syntax": ctx.tool_syntax()} if endpoint == CHAT else {}
    parsed = parse(body, n_ctx=engine.n_ctx, tier=tier, **syntax)
    model_id = ctx.served_model_id(parsed.model)
    submitted = await ctx.service.submit(parsed.specs, endpoint, id_prefix, caller_of(request))
    answer = answer_class(submitted.id, model_id, parsed, engine.model.token_bytes)
    spec, handles = parsed.specs[0], submitted.handles
    return await reply(
        request, ctx, handles, request_id=submitted.id, endpoint=endpoint, priority=spec.priority,
        stream=spec.stream, events=lambda: answer.stream(handles), error_event=answer.error_event,
        payload=answer.response, headers=submitted.headers,
    )
