"""Sending a batch line to the server's own route, in process, as if it came over HTTP.

What a batch cannot do is refused per line, in the route's own error shape (Anthropic's for
/v1/messages): a stream (each result is stored whole), and stored state on /v1/responses
(`store: true`, `previous_response_id`). A batch's results are its output file, and its requests
run under the server's own key, not their batch owner's, so a response stored or continued there
would belong to no caller, or reach another caller's responses. A /v1/responses line is sent
with `store: false`.
"""
from __future__ import annotations

from typing import Any

import httpx

from server.error_shapes import anthropic_error_body, speaks_anthropic
from server.errors import CLIENT_CLOSED_REQUEST, BadRequest
from server.jobs.store import ANONYMOUS, Outcome

# Read by server/auth.py, and only under the server's own key (a client cannot claim another's batch).
BATCH_OWNER_HEADER = "x-cobatch-batch-owner"

RESPONSES_URL = "/v1/responses"

# Answers that mean "not now", not "no": the server is draining or loading (503), the request
# was cut off by a shutdown or the queue is full (429). The request runs again later.
RETRY_LATER = frozenset({429, CLIENT_CLOSED_REQUEST, 503})


class InProcessRoutes:
    def __init__(self, app: Any, headers: dict[str, str] | None = None) -> None:
        # headers: the server's own key, when it requires keys
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cobatch.jobs",
                                         timeout=None, headers=headers)

    async def __call__(self, url: str, body: dict[str, Any], owner: str = ANONYMOUS) -> Outcome | None:
        refusal = _refusal(url, body)
        if refusal is not None:
            shaped = anthropic_error_body(refusal) if speaks_anthropic({"path": url}) else refusal.body()
            return Outcome(refusal.status_code, None, shaped)
        body = {**body, "priority": "batch"}
        if url == RESPONSES_URL:
            body["store"] = False
        response = await self._client.post(url, json=body, headers={BATCH_OWNER_HEADER: owner})
        if response.status_code in RETRY_LATER:
            return None
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": {"message": response.text[:1000], "type": "server_error", "param": None, "code": None}}
        return Outcome(response.status_code, response.headers.get("x-request-id"), payload)

    async def close(self) -> None:
        await self._client.aclose()


def _refusal(url: str, body: dict[str, Any]) -> BadRequest | None:
    """What this line asks that no batch request can do, or None."""
    if body.get("stream"):
        return BadRequest("stream is not available in a batch request: each result is stored whole", param="stream")
    if url == RESPONSES_URL:
        for name in ("store", "previous_response_id"):
            if body.get(name):
                return BadRequest(f"'{name}' is not available in a batch request: a batch keeps no responses "
                                  "(its results are its output file); send the whole conversation in 'input'",
                                  param=name)
    return None
