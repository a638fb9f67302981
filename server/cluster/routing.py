"""Which of Ray Serve's request routers picks the engine replica for each request.

"prefix" is Ray's own PrefixCacheAffinityRouter: it keeps a character radix tree per replica of
the prompts routed there (messages.route_key: one character per token for rendered chats) and
sends a request to the replica holding its longest prefix, unless the replicas' queue lengths
differ by more than `imbalanced_threshold` (then power-of-two choices). Its defaults do not suit
cobatch, so they are set here:
  * imbalanced_threshold is infinite in Ray 2.60: one system prompt shared by every tenant would
    pin all traffic on one replica. A finite one lets load balancing win past that difference.
  * eviction is off by default, while each replica's prefix cache holds only so many cells (and
    evicts on its own, unseen by the router): the tree is trimmed per replica to about the
    tokens one replica can keep, so stale prefixes stop attracting requests.
"round-robin" and "power-of-two" are Ray's cache-blind routers, the benchmark's baselines.
"""
from __future__ import annotations

from typing import Any

from ray.serve.config import RequestRouterConfig

PREFIX, ROUND_ROBIN, POWER_OF_TWO = "prefix", "round-robin", "power-of-two"
POLICIES = (PREFIX, ROUND_ROBIN, POWER_OF_TWO)

_CLASSES = {
    # The public alias ray.serve.llm.request_router imports all of ray.serve.llm, which needs
    # pyarrow (ray[llm]); the class itself does not.
    PREFIX: "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router.PrefixCacheAffinityRouter",
    ROUND_ROBIN: "ray.serve.experimental.round_robin_router.RoundRobinRouter",
    POWER_OF_TWO: "ray.serve._private.request_router.pow_2_router.PowerOfTwoChoicesRequestRouter",
}

DEFAULT_IMBALANCED_THRESHOLD = 4  # requests in flight on one replica beyond the least loaded


def router_config(policy: str, *, replica_tokens: int, imbalanced_threshold: float = DEFAULT_IMBALANCED_THRESHOLD,
                  stats_period_s: float | None = None) -> RequestRouterConfig:
    """`replica_tokens`: about how many prompt tokens one replica's KV cache holds (its n_ctx)."""
    if policy not in _CLASSES:
        raise ValueError(f"unknown routing policy {policy!r}; choose from {', '.join(POLICIES)}")
    kwargs: dict[str, Any] = {}
    if policy == PREFIX:
        kwargs = dict(
            imbalanced_threshold=imbalanced_threshold,
            do_eviction=True,
            eviction_threshold_chars=replica_tokens,
            eviction_target_chars=int(replica_tokens * 0.8),
            eviction_interval_secs=1,
        )
    extra = {"request_routing_stats_period_s": stats_period_s} if stats_period_s else {}
    return RequestRouterConfig(request_router_class=_CLASSES[policy], request_router_kwargs=kwargs, **extra)


def tree_actor_namespace(app_name: str, deployment_name: str) -> tuple[str, str]:
    """Where PrefixCacheAffinityRouter keeps its detached tree actor (name, namespace). Serve
    removes it only at serve.shutdown(): deleting one app of several must remove it by hand."""
    return "LlmPrefixTreeActor", f"serve::{app_name}::{deployment_name}"
