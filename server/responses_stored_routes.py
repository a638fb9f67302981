"""The Responses API's routes around stored responses (get, delete, input items) and its token count.

    GET    /v1/responses/{id}               the response as it was answered
    DELETE /v1/responses/{id}               {"id", "object": "response", "deleted": true}
    GET    /v1/responses/{id}/input_items   ?limit=20 (1..100) &order=desc|asc &after=<item id>
    POST   /v1/responses/input_tokens       a /v1/responses body (model optional) -> its prompt's tokens

A response belongs to the caller that made it (server/auth.py's Caller): another caller's is a
404, as if it did not exist; an admin key sees all. Without a data directory nothing is stored,
and every id is a 404 that says so.
"""
from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.auth import caller_of
from server.context import ServerContext
from server.errors import BadRequest, NotFound
from server.responses_routes import NO_DATA_DIR, RESPONSES, parse_with_history
from server.responses_store import StoredResponse
from server.spec import prompt_token_count
from server.tiers import route_default
from server.validation import read_json_object

INPUT_TOKENS = "responses_input_tokens"  # the metrics' endpoint label
_LIMITS = range(1, 101)


async def get_response(request: Request, ctx: ServerContext) -> Response:
    params = request.query_params
    if params.get("stream", "false").lower() not in ("false", "0"):
        raise BadRequest("'stream' is not supported here: a stored response is complete; get it whole",
                         param="stream")
    if params.getlist("include") or params.getlist("include[]"):
        raise BadRequest("'include' is not supported: a response here has no extra outputs to include",
                         param="include")
    return JSONResponse((await _stored(request, ctx)).response)


async def delete_response(request: Request, ctx: ServerContext) -> Response:
    response_id = request.path_params["response_id"]
    await _stored(request, ctx)
    if not await ctx.responses.delete(response_id, caller_of(request).scope):
        raise NotFound(f"response {response_id!r} was deleted", param="response_id", code="response_not_found")
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: Request, ctx: ServerContext) -> Response:
    params = request.query_params
    raw_limit = params.get("limit", "20")
    if not raw_limit.isdigit() or int(raw_limit) not in _LIMITS:
        raise BadRequest(f"'limit' must be an integer from 1 to 100, got {raw_limit!r}", param="limit")
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest(f"'order' must be 'asc' or 'desc', got {order!r}", param="order")
    if params.getlist("include") or params.getlist("include[]"):
        raise BadRequest("'include' is not supported: input items here have nothing extra to include",
                         param="include")
    items = (await _stored(request, ctx)).items
    items = items if order == "asc" else items[::-1]
    after = params.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise BadRequest(f"'after' {after!r} is not an item of this response", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:int(raw_limit)]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)})


async def input_tokens(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    body = {"model": ctx.require_model().model_id, **body}  # the model is optional here
    parsed, _ = await parse_with_history(request, ctx, body, n_ctx=engine.n_ctx,
                                         tier=route_default(ctx.settings.default_tier, RESPONSES))
    ctx.served_model_id(parsed.model)
    assert ctx.state.chat is not None
    count = await run_in_threadpool(prompt_token_count, parsed.spec, ctx.state.chat)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": count})


async def _stored(request: Request, ctx: ServerContext) -> StoredResponse:
    response_id = request.path_params["response_id"]
    if ctx.responses is None:
        raise NotFound(f"no response {response_id!r}: {NO_DATA_DIR}", param="response_id",
                       code="response_not_found")
    scope = caller_of(request).scope
    stored = await ctx.responses.find(response_id, scope)
    if stored is None:
        gone = await ctx.responses.was_deleted(response_id, scope)
        raise NotFound(f"response {response_id!r} {'was deleted' if gone else 'is not stored here'}",
                       param="response_id", code="response_not_found")
    return stored


def stored_response_routes() -> list[tuple[str, Any, str, str]]:
    """(path, handler, method, metrics label) of each route, in the order they must be matched."""
    return [
        ("/v1/responses/input_tokens", input_tokens, "POST", INPUT_TOKENS),
        ("/v1/responses/{response_id}", get_response, "GET", RESPONSES),
        ("/v1/responses/{response_id}", delete_response, "DELETE", RESPONSES),
        ("/v1/responses/{response_id}/input_items", input_items, "GET", RESPONSES),
    ]
