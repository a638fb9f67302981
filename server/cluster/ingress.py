"""The ingress deployment: the same Starlette app as `cobatch serve` (server/app.py), with a
RemoteEngine in place of the Engine and the cluster's views added."""
from __future__ import annotations

from typing import Any

from starlette.applications import Starlette

from server.app import create_app
from server.cluster.remote_engine import RemoteEngine
from server.cluster.views import add_cluster_views
from server.context import ServerSettings


class ClusterIngress:
    """Deployed as serve.deployment(serve.ingress()(ClusterIngress)); Serve calls
    __serve_build_asgi_app__ on the replica, then runs the app's lifespan (which starts
    connecting to the engine replicas in the background: /health says "loading" until then)."""

    def __init__(self, engine: Any, model_path: str | None, replicas: int, settings: ServerSettings,
                 stats_interval: float = 1.0) -> None:
        self._engine_handle = engine
        self._model_path = model_path
        self._replicas = replicas
        self._stats_interval = stats_interval
        self._settings = settings
        self.remote: RemoteEngine | None = None

    def _connect(self) -> RemoteEngine:
        self.remote = RemoteEngine(self._engine_handle, self._model_path, replicas=self._replicas,
                                   stats_interval=self._stats_interval)
        return self.remote

    def __serve_build_asgi_app__(self) -> Starlette:
        app = create_app(self._connect, self._settings)
        add_cluster_views(app, lambda: self.remote.replica_stats() if self.remote is not None else [])
        return app
