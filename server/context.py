"""What every route handler needs, bundled once per app."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.generation import GenerationService
from server.metrics import ServerMetrics
from server.state import OK, ModelInfo, ServingState


@dataclass(frozen=True)
class ServerSettings:
    drain_timeout: float = 30.0  # seconds running requests get to finish at shutdown
    max_body_bytes: int = 1024 * 1024  # far more than any context holds; bounds tokenizing work
    owns_engine: bool = True  # close the engine at shutdown (False when a test shares one)
    model_id: str | None = None  # name served as; default: the model file's stem


@dataclass
class ServerContext:
    settings: ServerSettings
    state: ServingState
    metrics: ServerMetrics
    service: GenerationService

    def require_engine(self) -> Any:
        """The engine if requests are being admitted, else the 503 that says why not."""
        state = self.state
        if state.status != OK:
            raise state.unavailable()
        return state.engine

    def require_model(self) -> ModelInfo:
        self.require_engine()
        assert self.state.model is not None
        return self.state.model
