"""Per-replica snapshots, and the cluster-wide sum the single-process views read as `stats()`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class ReplicaCounters:
    """Counted by a replica over its life (a restarted replica starts from zero)."""

    accepted: int = 0  # requests the engine took
    rejected: int = 0  # refused at submit (bad parameters, full queue, too long)
    finished: int = 0
    prompt_tokens: int = 0  # of finished requests
    cached_tokens: int = 0  # of those, served from the prefix cache
    generated_tokens: int = 0


@dataclass(frozen=True)
class ReplicaSnapshot:
    replica: str  # Serve's unique replica id
    pid: int
    rss_bytes: int
    engine: Any  # the replica engine's stats() (engine.EngineStats)
    counters: ReplicaCounters


# Fields that describe a configuration rather than an amount: equal on every replica, not summed.
_SAME_ON_EVERY_REPLICA = {"block_size", "interactive_token_target_ms", "latency_calibration"}
# Shares: the cluster's is the replicas' mean.
_MEAN_OVER_REPLICAS = {"reuse_share"}


def sum_stats(items: Sequence[Any]) -> Any:
    """Field-wise sum of equal-typed stats (frozen dataclasses of ints, floats, dicts of them and
    nested such dataclasses). Generic on purpose: it follows the engine's stats as they grow."""
    if not items:
        raise ValueError("no stats to sum")
    first = items[0]
    if dataclasses.is_dataclass(first):
        values = {}
        for f in dataclasses.fields(first):
            column = [getattr(item, f.name) for item in items]
            if f.name in _SAME_ON_EVERY_REPLICA:
                values[f.name] = column[0]
            elif f.name in _MEAN_OVER_REPLICAS:
                values[f.name] = sum(column) / len(column)
            else:
                values[f.name] = sum_stats(column)
        return dataclasses.replace(first, **values)
    if isinstance(first, dict):
        keys = dict.fromkeys(k for item in items for k in item)
        return {k: sum_stats([item[k] for item in items if k in item]) for k in keys}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return sum(items)
    return first
