"""Building cobatch's Serve application, and running it for `cobatch serve --replicas N`."""
from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import ray
from ray import serve

from server.cluster.ingress import ClusterIngress
from server.cluster.replica import EngineReplica
from server.cluster.routing import DEFAULT_IMBALANCED_THRESHOLD, PREFIX, router_config, tree_actor_namespace
from server.context import DEFAULT_DRAIN_TIMEOUT_S, INGRESS_STOP_BACKSTOP_S, REPLICA_STOP_BACKSTOP_S, ServerSettings
from server.jobs.runner import in_flight_for

log = logging.getLogger("cobatch.cluster")

APP_NAME = "cobatch"
ENGINE_DEPLOYMENT, INGRESS_DEPLOYMENT = "cobatch-engine", "cobatch-ingress"
# The directory holding engine/, server/, ...: replicas import the same code as the driver.
CODE_ROOT = str(Path(__file__).resolve().parents[2])


def replica_capacity(engine_options: dict[str, Any]) -> int:
    """Requests one replica takes at once: all its running slots and both queues, so that
    cobatch's two priority tiers order the work, not Ray's FIFO in front of the replica."""
    from engine import EngineConfig

    cfg = EngineConfig(**{k: v for k, v in engine_options.items() if v is not None})
    return cfg.max_running + cfg.max_waiting + cfg.max_waiting_interactive


def build_application(
    model_path: str | None,
    engine_options: dict[str, Any],
    *,
    replicas: int,
    routing: str = PREFIX,
    imbalanced_threshold: float = DEFAULT_IMBALANCED_THRESHOLD,
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S,
    model_id: str | None = None,
    replica_cpus: float = 1.0,
    stats_interval: float = 1.0,
    data_dir: Path | None = None,
    max_upload_bytes: int | None = None,
    api_keys: tuple[str, ...] = (),
    protect_metrics: bool = False,
    default_tier: str = "auto",
    admin_api_keys: tuple[str, ...] = (),
    tenant_keys: tuple[Any, ...] = (),
    web: bool = True,
) -> Any:
    """The Serve application: an ingress over `replicas` engine replicas. engine_options are
    Engine keyword arguments; n_threads=None means the replica's node cores / replicas. With a
    data_dir the ingress runs batch jobs, its store on the ingress's machine, spreading their
    requests over the replicas as it routes live ones."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    capacity = replica_capacity(engine_options)
    engine = serve.deployment(
        EngineReplica,
        name=ENGINE_DEPLOYMENT,
        num_replicas=replicas,
        max_ongoing_requests=capacity,
        ray_actor_options={"num_cpus": replica_cpus},
        request_router_config=router_config(routing, replica_tokens=engine_options.get("n_ctx") or 8192,
                                            imbalanced_threshold=imbalanced_threshold),
        # Serve waits this long for a stopping replica's requests before calling __del__.
        graceful_shutdown_timeout_s=drain_timeout + REPLICA_STOP_BACKSTOP_S,
        health_check_period_s=5.0,
        # The ingress polls every replica's stats each second: one access log line per poll.
        logging_config={"enable_access_log": False},
    ).bind(model_path, engine_options, drain_timeout, replicas)
    ingress = serve.deployment(
        serve.ingress()(ClusterIngress),
        name=INGRESS_DEPLOYMENT,
        num_replicas=1,
        max_ongoing_requests=replicas * capacity,
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_timeout_s=drain_timeout + INGRESS_STOP_BACKSTOP_S,
    ).bind(engine, model_path, replicas, _ingress_settings(engine_options, replicas, drain_timeout, model_id, data_dir,
                                                           max_upload_bytes, api_keys, protect_metrics,
                                                           default_tier, admin_api_keys, tenant_keys, web),
              stats_interval)
    return ingress


def _ingress_settings(engine_options: dict[str, Any], replicas: int, drain_timeout: float, model_id: str | None,
                      data_dir: Path | None, max_upload_bytes: int | None, api_keys: tuple[str, ...],
                      protect_metrics: bool, default_tier: str,
                      admin_api_keys: tuple[str, ...], tenant_keys: tuple[Any, ...] = (),
                      web: bool = True) -> ServerSettings:
    from engine import EngineConfig

    max_running = EngineConfig(**{k: v for k, v in engine_options.items() if v is not None}).max_running
    extra = {} if max_upload_bytes is None else {"max_upload_bytes": max_upload_bytes}
    return ServerSettings(drain_timeout=drain_timeout, model_id=model_id, data_dir=data_dir,
                          jobs_in_flight=replicas * in_flight_for(max_running), api_keys=api_keys,
                          protect_metrics=protect_metrics, default_tier=default_tier,
                          admin_api_keys=admin_api_keys, tenant_keys=tenant_keys, web=web, **extra)


def remove_app(app_name: str) -> None:
    """Delete one application and its prefix router's tree actor (detached: Serve would keep it,
    and the logical CPU it holds, until serve.shutdown())."""
    serve.delete(app_name)
    name, namespace = tree_actor_namespace(app_name, ENGINE_DEPLOYMENT)
    try:
        ray.kill(ray.get_actor(name, namespace=namespace))
    except ValueError:  # no such actor: not a prefix-routed app
        pass


def init_ray(address: str | None, replicas: int, replica_cpus: float) -> None:
    """Join a running Ray cluster, or start a local one big enough for the replicas plus the
    prefix router's tree actor (which needs a logical CPU of its own)."""
    if ray.is_initialized():
        return
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (CODE_ROOT, os.environ.get("PYTHONPATH")) if p)}}
    if address:
        ray.init(address=address, runtime_env=env)
    else:
        cpus = max(os.cpu_count() or 1, int(replicas * replica_cpus + 0.999) + 2)
        # Loopback only: a local instance has no business on the machine's other addresses.
        ray.init(num_cpus=cpus, include_dashboard=False, runtime_env=env, _node_ip_address="127.0.0.1")


def serve_cluster(options: Any, engine_options: dict[str, Any]) -> int:
    """`cobatch serve --replicas N`: deploy, serve until SIGTERM/SIGINT, then drain and stop."""
    init_ray(options.ray_address, options.replicas, options.replica_cpus)
    serve.start(http_options={"host": options.host, "port": options.port})
    app = build_application(
        options.model, engine_options, replicas=options.replicas, routing=options.routing,
        imbalanced_threshold=options.imbalanced_threshold, drain_timeout=options.drain_timeout,
        model_id=options.model_id, replica_cpus=options.replica_cpus, data_dir=options.data_dir,
        max_upload_bytes=options.max_upload_bytes, api_keys=options.api_keys, admin_api_keys=options.admin_api_keys,
        tenant_keys=options.tenant_keys, protect_metrics=options.protect_metrics,
        default_tier=options.default_tier, web=options.web,
    )
    serve.run(app, name=APP_NAME, route_prefix="/")
    log.info("serving %d engine replicas on http://%s:%d (routing: %s)", options.replicas, options.host,
             options.port, options.routing)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    # Serve stops the ingress first-come with the replicas; each waits for its running requests
    # (graceful_shutdown_timeout_s), and the ingress's app drains as `cobatch serve` does.
    log.info("draining (up to %.0f s)", options.drain_timeout)
    serve.delete(APP_NAME)
    serve.shutdown()
    ray.shutdown()
    return 0
