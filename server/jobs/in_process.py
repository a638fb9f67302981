"""Sending a batch line to the server's own route, in process, as if it came over HTTP."""
from __future__ import annotations

from typing import Any

import httpx

from server.errors import CLIENT_CLOSED_REQUEST, BadRequest
from server.jobs.store import Outcome

# Answers that mean "not now", not "no": the server is draining or loading (503), the request
# was cut off by a shutdown or the queue is full (429). The request runs again later.
RETRY_LATER = frozenset({429, CLIENT_CLOSED_REQUEST, 503})


class InProcessRoutes:
    def __init__(self, app: Any, headers: dict[str, str] | None = None) -> None:
        # headers: the server's own key, when it requires keys
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cobatch.jobs",
                                         timeout=None, headers=headers)

    async def __call__(self, url: str, body: dict[str, Any]) -> Outcome | None:
        if body.get("stream"):
            error = BadRequest("stream is not available in a batch request: each result is stored whole",
                               param="stream")
            return Outcome(error.status_code, None, error.body())
        response = await self._client.post(url, json={**body, "priority": "batch"})
        if response.status_code in RETRY_LATER:
            return None
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": {"message": response.text[:1000], "type": "server_error", "param": None, "code": None}}
        return Outcome(response.status_code, response.headers.get("x-request-id"), payload)

    async def close(self) -> None:
        await self._client.aclose()
