"""What the cluster adds to the single-process app's views, without editing them: /health lists
every replica, and /metrics repeats every engine family per replica under `cobatch_replica_*`
with a `replica` label (the unlabelled families stay the cluster-wide sums)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.cluster.replica_stats import ReplicaCounters, ReplicaSnapshot
from server.health import health_payload
from server.metrics import _EngineCollector  # the single-process families, reused per replica
from server.state import OK

_PREFIX, _REPLICA_PREFIX = "cobatch_", "cobatch_replica_"
_OWN_PROCESS = "cobatch_process_resident_memory_bytes"  # the ingress's; replicas report their own


def add_cluster_views(app: Starlette, replicas: Callable[[], list[ReplicaSnapshot]]) -> None:
    ctx = app.state.ctx

    async def health(request: Request) -> Response:
        payload = health_payload(ctx.state)
        if ctx.state.engine is not None:
            payload["replicas"] = [replica_health(s) for s in replicas()]
        return JSONResponse(payload, status_code=200 if ctx.state.status == OK else 503)

    # Routes match in order: this /health shadows the app's own.
    app.router.routes.insert(0, Route("/health", health, methods=["GET"]))
    ctx.metrics.registry.register(ReplicaCollector(lambda: replicas() if ctx.state.engine is not None else []))


def replica_health(s: ReplicaSnapshot) -> dict[str, Any]:
    stats = s.engine
    kv = getattr(stats, "kv", None)
    return {
        "replica": s.replica,
        "pid": s.pid,
        "rss_bytes": s.rss_bytes,
        "running": stats.running,
        "queue": dict(stats.waiting),
        "kv": {"cells_used": stats.kv_cells_used, "cells_total": stats.kv_cells_total,
               **({"prefix_hit_tokens": kv.prefix_hit_tokens, "blocks_cached": kv.blocks_cached} if kv else {})},
        "requests": dataclasses.asdict(s.counters),
    }


class ReplicaCollector(Collector):
    def __init__(self, replicas: Callable[[], list[ReplicaSnapshot]]) -> None:
        self._replicas = replicas

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        families: dict[str, Metric] = {}
        for snapshot in self._replicas():
            for family in _replica_families(snapshot):
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                merged.samples.extend(family.samples)
        yield from families.values()


def _replica_families(s: ReplicaSnapshot) -> Iterable[Metric]:
    label = {"replica": s.replica}
    for family in _EngineCollector(lambda: s.engine).collect():
        if family.name == _OWN_PROCESS:
            continue
        renamed = Metric(_REPLICA_PREFIX + family.name[len(_PREFIX):], family.documentation, family.type)
        renamed.samples = [
            sample._replace(name=_REPLICA_PREFIX + sample.name[len(_PREFIX):], labels={**sample.labels, **label})
            for sample in family.samples
        ]
        yield renamed
    rss = GaugeMetricFamily("cobatch_replica_process_resident_memory_bytes", "Resident set size of the replica",
                            labels=["replica"])
    rss.add_metric([s.replica], s.rss_bytes)
    yield rss
    for field in dataclasses.fields(ReplicaCounters):
        counter = CounterMetricFamily(f"cobatch_replica_requests_{field.name}", f"Replica requests: {field.name}",
                                      labels=["replica"])
        counter.add_metric([s.replica], getattr(s.counters, field.name))
        yield counter
