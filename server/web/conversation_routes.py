"""The web page's conversation routes (/v1/web/conversations) over server/web/conversations.py.

    GET    /v1/web/conversations        the caller's conversations, most recent first (no messages)
    POST   /v1/web/conversations        {"title"?, "messages"?, "settings"?}: a new one
    GET    /v1/web/conversations/{id}   the conversation with its messages and settings
    POST   /v1/web/conversations/{id}   {"title"?, "messages"?, "settings"?}: replaces the fields given
    DELETE /v1/web/conversations/{id}

Protected like every other route when keys are set; each caller sees only its own (another's are
404, as if they did not exist), an admin key sees all.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.auth import caller_of
from server.errors import BadRequest, NotFound
from server.jobs.store_thread import StoreThread
from server.validation import read_json_object
from server.web.conversations import ConversationStore

MAX_TITLE = 200
MAX_MESSAGES = 2000
ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = {"role", "content", "stats"}  # stats: what the page measured of an answer (TTFT, tok/s, ...)
DEFAULT_TITLE = "New conversation"


class Conversations:
    """The store and the one thread its calls run on."""

    def __init__(self, store: ConversationStore, max_body_bytes: int) -> None:
        self.store = store
        self.db = StoreThread()
        self.max_body_bytes = max_body_bytes

    async def close(self) -> None:
        await self.db(self.store.close)
        self.db.close()


def conversation_routes(conversations: Conversations,
                        wrap: Callable[[Callable[[Request], Awaitable[Response]], str], Any]) -> list[Route]:
    """The routes, each passed through `wrap(handler, endpoint)` (the app's error handling)."""
    def route(path: str, handler: Callable[[Conversations, Request], Awaitable[Response]], method: str) -> Route:
        async def run(request: Request) -> Response:
            return await handler(conversations, request)

        return Route(path, wrap(run, "web_conversations"), methods=[method])

    return [
        route("/v1/web/conversations", list_conversations, "GET"),
        route("/v1/web/conversations", create_conversation, "POST"),
        route("/v1/web/conversations/{conversation_id}", get_conversation, "GET"),
        route("/v1/web/conversations/{conversation_id}", update_conversation, "POST"),
        route("/v1/web/conversations/{conversation_id}", delete_conversation, "DELETE"),
    ]


async def list_conversations(c: Conversations, request: Request) -> Response:
    rows = await c.db(c.store.list, owner=caller_of(request).scope)
    return JSONResponse({"object": "list", "data": rows})


async def create_conversation(c: Conversations, request: Request) -> Response:
    fields = read_fields(await read_json_object(request, c.max_body_bytes))
    created = await c.db(c.store.create, fields.get("title", DEFAULT_TITLE), fields.get("messages", []),
                         fields.get("settings", {}), owner=caller_of(request).owner)
    return JSONResponse(created)


async def get_conversation(c: Conversations, request: Request) -> Response:
    conversation_id = request.path_params["conversation_id"]
    found = await c.db(c.store.get, conversation_id, owner=caller_of(request).scope)
    return JSONResponse(_or_404(found, conversation_id))


async def update_conversation(c: Conversations, request: Request) -> Response:
    conversation_id = request.path_params["conversation_id"]
    fields = read_fields(await read_json_object(request, c.max_body_bytes))
    if not fields:
        raise BadRequest("send at least one of title, messages, settings")
    updated = await c.db(c.store.update, conversation_id, fields, owner=caller_of(request).scope)
    return JSONResponse(_or_404(updated, conversation_id))


async def delete_conversation(c: Conversations, request: Request) -> Response:
    conversation_id = request.path_params["conversation_id"]
    if not await c.db(c.store.delete, conversation_id, owner=caller_of(request).scope):
        _or_404(None, conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation", "deleted": True})


def _or_404(found: dict[str, Any] | None, conversation_id: str) -> dict[str, Any]:
    if found is None:
        raise NotFound(f"no conversation with id {conversation_id!r}", param="conversation_id",
                       code="conversation_not_found")
    return found


def read_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A create or update body's fields, checked; a bad one is a 400 naming it."""
    unknown = sorted(set(body) - {"title", "messages", "settings"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r}", param=unknown[0])
    fields: dict[str, Any] = {}
    if "title" in body:
        title = body["title"]
        if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE:
            raise BadRequest(f"title must be a non-empty string of at most {MAX_TITLE} characters", param="title")
        fields["title"] = title.strip()
    if "messages" in body:
        fields["messages"] = _messages(body["messages"])
    if "settings" in body:
        if not isinstance(body["settings"], dict):
            raise BadRequest("settings must be an object", param="settings")
        fields["settings"] = body["settings"]
    return fields


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_MESSAGES:
        raise BadRequest(f"messages must be an array of at most {MAX_MESSAGES} messages", param="messages")
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        unknown = sorted(set(message) - MESSAGE_KEYS)
        if unknown:
            raise BadRequest(f"{where} has an unknown field {unknown[0]!r}", param=f"{where}.{unknown[0]}")
        if message.get("role") not in ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role")
        if not isinstance(message.get("content"), str):
            raise BadRequest(f"{where}.content must be a string", param=f"{where}.content")
        if "stats" in message and not isinstance(message["stats"], dict):
            raise BadRequest(f"{where}.stats must be an object", param=f"{where}.stats")
    return value
