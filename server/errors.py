"""HTTP errors, raised by every route and answered in OpenAI's shape (the Messages routes answer
them in Anthropic's: server/error_shapes.py).

Every error body is `{"error": {"message", "type", "param", "code"}}`: the shape the official
OpenAI clients parse, so their exceptions carry our message unchanged.
"""
from __future__ import annotations

import math
import re
from typing import Mapping

from starlette.responses import JSONResponse

# nginx's status for a request the client gave up on: nobody reads it (uvicorn drops it), but the
# access log and the metrics tell it apart from an answer.
CLIENT_CLOSED_REQUEST = 499


class APIError(Exception):
    """A request that the server answers with an error status; nothing else is affected."""

    status_code = 500
    error_type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


class BadRequest(APIError):
    status_code = 400
    error_type = "invalid_request_error"


class Forbidden(APIError):
    status_code = 403
    error_type = "permission_error"


class NotFound(APIError):
    status_code = 404
    error_type = "not_found_error"


class MethodNotAllowed(APIError):
    status_code = 405
    error_type = "invalid_request_error"


class PayloadTooLarge(APIError):
    status_code = 413
    error_type = "invalid_request_error"


class TooManyRequests(APIError):
    status_code = 429
    error_type = "rate_limit_error"


def retry_after(wait_s: float) -> dict[str, str]:
    """The wait a 429 names, in both headers clients read: `retry-after-ms` (the `openai` SDK
    reads it first) and `Retry-After` in whole seconds, at least 1 (the only form most others read)."""
    return {"Retry-After": str(max(1, math.ceil(wait_s))), "retry-after-ms": str(max(1, round(wait_s * 1000)))}


class InternalError(APIError):
    status_code = 500
    error_type = "server_error"


class NotImplementedFeature(APIError):
    """Something the API defines but this engine cannot do yet: said plainly, never faked."""

    status_code = 501
    error_type = "not_implemented_error"


class ServiceUnavailable(APIError):
    status_code = 503
    error_type = "service_unavailable_error"


class GatewayTimeout(APIError):
    status_code = 504
    error_type = "timeout_error"


def renamed(error: APIError, renames: list[tuple[re.Pattern[str], str]]) -> APIError:
    """`error` with its field names rewritten by `renames` (pattern, replacement), in order, in its
    message and its param: a check shared by several dialects speaks each one's names."""
    def rename(text: str) -> str:
        for pattern, replacement in renames:
            text = pattern.sub(replacement, text)
        return text

    param = None if error.param is None else rename(f"'{error.param}'")[1:-1]
    return type(error)(rename(error.message), param=param, code=error.code, headers=error.headers)
