"""The tenants' request limits at the door: a generation request from a tenant already at its
in-flight or per-minute limit is refused before its body is read or its route runs. A client
that keeps sending past its limit then costs the server about what an empty request costs, not
a body parsed and validated per refusal; the route's own check (`Quotas.admit`) still decides
for every request let through, the token limit included."""
from __future__ import annotations

from typing import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from server.error_shapes import error_response
from server.metrics import ServerMetrics
from server.quotas import Quotas, RateLimited


class LimitGate:
    """ASGI middleware, inside RequireKeys (which puts the caller in the scope's state)."""

    def __init__(self, app: ASGIApp, quotas: Quotas, metrics: ServerMetrics, endpoints: Mapping[str, str]) -> None:
        self.app = app
        self.quotas = quotas
        self.metrics = metrics
        self.endpoints = endpoints  # generation path → its metrics' endpoint label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        caller = scope.get("state", {}).get("caller") if endpoint is not None else None
        if caller is not None and not caller.internal:  # the server's own requests are paced by the job runner
            try:
                self.quotas.refuse_early(caller.tenant)
            except RateLimited as refusal:
                self.metrics.observe_tenant_refusal(caller.tenant.name, refusal.reason)
                self.metrics.observe_rejection(endpoint, refusal.status_code, refusal.code or refusal.error_type)
                return await error_response(refusal, scope)(scope, receive, send)
        await self.app(scope, receive, send)
