"""What every route handler needs, bundled once per app."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.errors import NotFound
from server.generation import GenerationService
from server.metrics import ServerMetrics
from server.tool_syntax import GENERIC, ToolSyntax
from server.state import OK, ModelInfo, ServingState
from server.tenants import TenantKey

if TYPE_CHECKING:
    from server.responses_keeper import ResponseKeeper


DEFAULT_DRAIN_TIMEOUT_S = 30.0  # seconds running requests get to finish at shutdown

# Shutdown backstops. Each bounds a wait that ends much sooner unless something is stuck, so a
# bug delays the process's exit instead of hanging it.
# Cancelled requests answer within one engine step; the drain waits this long for them.
CANCEL_BACKSTOP_S = 10.0
# The lifespan waits drain_timeout + this for the drain: the cancels above, then the engine's close.
SHUTDOWN_BACKSTOP_S = CANCEL_BACKSTOP_S + 5.0
# uvicorn's timeout_graceful_shutdown is int(drain_timeout + this): connections end once their
# requests have finished or been cancelled, and cancels answer within CANCEL_BACKSTOP_S.
HTTP_SHUTDOWN_BACKSTOP_S = CANCEL_BACKSTOP_S
# Joining a helper thread whose event loop was told to stop: it stops at once unless a callback hangs.
THREAD_JOIN_BACKSTOP_S = 10.0
# Ray Serve's graceful_shutdown_timeout_s is drain_timeout + these. A replica's engine drains in
# drain_timeout; the ingress also waits for the replicas' last results and its own app's drain.
REPLICA_STOP_BACKSTOP_S = 5.0
INGRESS_STOP_BACKSTOP_S = SHUTDOWN_BACKSTOP_S + REPLICA_STOP_BACKSTOP_S


@dataclass(frozen=True)
class ServerSettings:
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S  # seconds running requests get to finish at shutdown
    max_body_bytes: int = 1024 * 1024  # far more than any context holds; bounds tokenizing work
    owns_engine: bool = True  # close the engine at shutdown (False when a test shares one)
    model_id: str | None = None  # name served as; default: the model file's stem
    data_dir: Path | None = None  # batch jobs' store; None: no /v1/files or /v1/batches
    max_upload_bytes: int = 200 * 1024 * 1024  # a batch input file's limit, as OpenAI's
    jobs_in_flight: int = 40  # batch-job requests in the engine at once (server.jobs.runner.in_flight_for)
    api_keys: tuple[str, ...] = ()  # none: no authentication (server/auth.py)
    admin_api_keys: tuple[str, ...] = ()  # accepted as any key, and see every key's files and batches
    tenant_keys: tuple[TenantKey, ...] = ()  # a keys file's: each key's tenant, weight, tiers, limits
    protect_metrics: bool = False  # /metrics needs a key too (/health never does)
    default_tier: str = "auto"  # a request naming no tier: server/tiers.py route_default
    web: bool = True  # the web page at / and its routes (server/web/)
    tool_format: str = "auto"  # how tool calls are written: server/chat_setup.py


@dataclass
class ServerContext:
    settings: ServerSettings
    state: ServingState
    metrics: ServerMetrics
    service: GenerationService
    responses: ResponseKeeper | None = None  # stored responses, with a data directory

    def require_engine(self) -> Any:
        """The engine if requests are being admitted, else the 503 that says why not."""
        state = self.state
        if state.status != OK:
            raise state.unavailable()
        return state.engine

    def tool_syntax(self) -> ToolSyntax:
        """How the served model writes tool calls (its chat format's, server/chat_setup.py)."""
        return GENERIC if self.state.chat is None else self.state.chat.tool_syntax

    def require_model(self) -> ModelInfo:
        self.require_engine()
        assert self.state.model is not None
        return self.state.model

    def served_model_id(self, name: str) -> str:
        """The served model's id if a request's `model` names it, else a 404."""
        model = self.require_model()
        if not model.accepts_name(name):
            raise NotFound(f"model {name!r} is not served here; this server serves {model.model_id!r}",
                           param="model", code="model_not_found")
        return model.model_id
