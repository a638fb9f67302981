"""Which shape an error is answered in: Anthropic's on the Messages routes (/v1/messages...),
OpenAI's on every other route.

Anthropic's body is `{"type": "error", "error": {"type", "message"}}`, its type named by the
status (the anthropic SDK picks its exception class by status and shows the message). Choosing by
path lets the parts that know no route (the key check, unknown paths, wrong methods) answer a
Messages client in the shape its SDK parses.
"""
from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from server.errors import APIError
from server.sse import encode_event

MESSAGES_PATH = "/v1/messages"

# Anthropic's error types by HTTP status; any other 4xx is an invalid request, any other 5xx an
# api_error. A full or closing server is "overloaded" (Anthropic's own status for it is 529; the
# SDK treats 503 the same way, as retryable).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def speaks_anthropic(scope: dict[str, Any]) -> bool:
    """Whether an ASGI request is on a Messages route (under the app's root path, if any)."""
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error_body(error: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_error_type(error.status_code), "message": error.message}}


def anthropic_error_event(error: APIError) -> bytes:
    """An error inside a Messages stream: the SSE event the anthropic SDK raises as an APIError."""
    return encode_event(anthropic_error_body(error), event="error")


def error_response(error: APIError, scope: dict[str, Any]) -> Response:
    """`error` answered in the shape of the route the request was sent to."""
    if not speaks_anthropic(scope):
        return error.response()
    return JSONResponse(anthropic_error_body(error), status_code=error.status_code, headers=error.headers)
