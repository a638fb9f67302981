"""OpenAI's Responses API: POST /v1/responses.

The chat route's path with the Responses shapes at both ends: the body becomes the chat route's
GenerationSpec (server/responses_schemas.py), is submitted under an id `resp_…` like any chat, and
is answered as a response object or its typed event stream (server/responses_answers.py).

With a data directory, a response is stored unless `store` is false (OpenAI's default), with its
whole context (server/responses_items.py), before it is sent; `previous_response_id` continues a
stored one. Without a data directory nothing can be kept: `store: true` and `previous_response_id`
are refused, and a response says `"store": false`. The stored responses' own routes are in
server/responses_stored_routes.py.
"""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.auth import caller_of
from server.context import ServerContext
from server.errors import BadRequest, NotFound
from server.replies import reply_in_dialect
from server.responses_answers import Keep, ResponseAnswer
from server.responses_items import continued_items, listed_items
from server.responses_schemas import ResponsesRequest, in_responses_terms, parse_responses_body, previous_response_id
from server.responses_store import StoredResponse
from server.auth import caller_of
from server.tiers import route_default
from server.validation import read_json_object

RESPONSES = "responses"  # the metrics' endpoint label, and the tier's route (a chat: interactive)
NO_DATA_DIR = "this server keeps no responses: it runs without a data directory (cobatch serve --data-dir)"


async def responses(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    tier = route_default(ctx.settings.default_tier, RESPONSES, caller_of(request).tenant.default_tier)
    parsed, earlier = await parse_with_history(request, ctx, body, n_ctx=engine.n_ctx, tier=tier)
    model_id = ctx.served_model_id(parsed.model)
    keep = _keeper_for(request, ctx, parsed, earlier, body["input"])
    spec = parsed.spec
    return await reply_in_dialect(
        request, ctx, spec, RESPONSES, "resp_", in_responses_terms,
        lambda request_id, handles: ResponseAnswer(request_id, model_id, spec, parsed.echo, keep))


async def parse_with_history(request: Request, ctx: ServerContext, body: dict[str, Any], *, n_ctx: int,
                             tier: str) -> tuple[ResponsesRequest, list[dict[str, Any]]]:
    """The body read after the items its previous_response_id stands for (a 404 if the caller
    has no such stored response), and those items."""
    previous_id = previous_response_id(body)
    earlier: list[dict[str, Any]] = []
    if previous_id is not None:
        if ctx.responses is None:
            raise BadRequest(f"'previous_response_id' cannot be used: {NO_DATA_DIR}", param="previous_response_id")
        scope = caller_of(request).scope
        previous = await ctx.responses.find(previous_id, scope)
        if previous is None:
            gone = await ctx.responses.was_deleted(previous_id, scope)
            raise NotFound(f"previous response {previous_id!r} {'was deleted' if gone else 'is not stored here'}",
                           param="previous_response_id", code="response_not_found")
        earlier = continued_items(previous)
    return parse_responses_body(body, n_ctx=n_ctx, tier=tier, earlier=earlier,
                                tool_syntax=ctx.tool_syntax()), earlier


def _keeper_for(request: Request, ctx: ServerContext, parsed: ResponsesRequest, earlier: list[dict[str, Any]],
                input_: Any) -> Keep | None:
    """How the response is kept with its context (`earlier`, then the items of `input_`), or None
    when it is not to be."""
    if ctx.responses is None:
        if parsed.store:
            raise BadRequest(f"'store': true cannot be honoured: {NO_DATA_DIR}; send \"store\": false", param="store")
        return None
    if parsed.store is False:
        return None
    keeper, owner = ctx.responses, caller_of(request).owner
    items = earlier + listed_items(input_)

    async def keep(response: dict[str, Any]) -> bool:
        return await keeper.keep(StoredResponse(response["id"], owner, response, items))

    return keep
