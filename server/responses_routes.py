"""OpenAI's Responses API: POST /v1/responses.

The chat route's path with the Responses shapes at both ends: the body becomes the chat route's
GenerationSpec (server/responses_schemas.py), is submitted under an id `resp_…` like any chat, and
is answered as a response object or its typed event stream (server/responses_answers.py).
Nothing is stored: each request carries its whole conversation (docs/responses-api.md).
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.context import ServerContext
from server.replies import reply_in_dialect
from server.responses_answers import ResponseAnswer
from server.responses_schemas import in_responses_terms, parse_responses_body
from server.tiers import route_default
from server.validation import read_json_object

RESPONSES = "responses"  # the metrics' endpoint label, and the tier's route (a chat: interactive)


async def responses(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    parsed = parse_responses_body(body, n_ctx=engine.n_ctx,
                                  tier=route_default(ctx.settings.default_tier, RESPONSES))
    model_id = ctx.served_model_id(parsed.model)
    spec = parsed.spec
    return await reply_in_dialect(
        request, ctx, spec, RESPONSES, "resp_", in_responses_terms,
        lambda request_id, handles: ResponseAnswer(request_id, model_id, spec, parsed.echo))
