"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

The chat route's path with Anthropic's shapes at both ends: the body becomes the chat route's
GenerationSpec (server/anthropic_schemas.py), is submitted under an id `msg_…` like any chat,
and is answered as Anthropic answers (server/anthropic_answers.py). Errors on these routes take
Anthropic's shape (server/error_shapes.py).
"""
from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.anthropic_answers import MessageAnswer
from server.anthropic_schemas import in_anthropic_terms, parse_count_tokens_body, parse_messages_body
from server.context import ServerContext
from server.replies import reply_in_dialect
from server.spec import prompt_token_count
from server.auth import caller_of
from server.tiers import route_default
from server.validation import read_json_object

MESSAGES = "messages"  # the metrics' endpoint label, and the tier's route (a chat: interactive)
COUNT_TOKENS = "messages_count_tokens"


async def messages(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    tier = route_default(ctx.settings.default_tier, MESSAGES, caller_of(request).tenant.default_tier)
    parsed = parse_messages_body(body, n_ctx=engine.n_ctx, tier=tier, tool_syntax=ctx.tool_syntax())
    model_id = ctx.served_model_id(parsed.model)
    spec = parsed.spec
    return await reply_in_dialect(
        request, ctx, spec, MESSAGES, "msg_", in_anthropic_terms,
        lambda request_id, handles: MessageAnswer(request_id, model_id, spec, handles[0].prompt_tokens))


async def count_tokens(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    parsed = parse_count_tokens_body(body, n_ctx=engine.n_ctx, tool_syntax=ctx.tool_syntax())
    ctx.served_model_id(parsed.model)
    assert ctx.state.chat is not None
    return JSONResponse({"input_tokens": await run_in_threadpool(prompt_token_count, parsed.spec, ctx.state.chat)})
