"""The engine deployment: each Serve replica owns one Engine and streams its requests."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any, AsyncIterator

from ray import serve

from engine import REFUSALS, Engine
from server.cluster.messages import Accepted, EngineCall, Rejected
from server.cluster.replica_stats import ReplicaCounters, ReplicaSnapshot
from server.health import process_rss_bytes

log = logging.getLogger("cobatch.cluster")

_REFUSALS = tuple(REFUSALS.values())


class EngineReplica:
    """Serve deploys this class with N replicas (see deploy.py); the ingress calls `generate`
    through a DeploymentHandle with stream=True, and `cancel` / `stats` with broadcast()."""

    def __init__(self, model_path: str | None, engine_options: dict[str, Any], drain_timeout: float,
                 replicas: int = 1) -> None:
        options = dict(engine_options)
        if options.get("n_threads") is None:  # this node's cores, shared by the deployment's replicas
            options["n_threads"] = max(1, (os.cpu_count() or 1) // replicas)
        self._engine = Engine(model_path, **options)
        self._drain_timeout = drain_timeout
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._counters = ReplicaCounters()
        self._live: dict[str, Any] = {}  # request id -> engine handle
        log.info("engine replica %s ready (pid %d, %s)", self.replica, os.getpid(), options)

    async def generate(self, call: EngineCall) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        # Tokenizing a long prompt takes milliseconds: off the replica's event loop.
        future = loop.run_in_executor(None, self._submit, call)
        try:
            handle = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_cancel_submitted)  # cancelled mid-submit: don't leave it running
            raise
        except _REFUSALS as exc:
            self._count(rejected=1)
            yield Rejected.of(exc)
            return
        self._live[handle.request_id] = handle
        self._count(accepted=1)
        try:
            yield Accepted(self.replica, handle.prompt_tokens)
            async for delta in handle:
                yield delta
            result = await handle
            m = result.metrics
            self._count(finished=1, prompt_tokens=m.prompt_tokens, cached_tokens=m.cached_tokens,
                        generated_tokens=m.tokens_generated)
            yield result
        finally:
            # The caller cancelled (client gone, ingress draining) or the stream broke: free the
            # sequence and its KV cells now rather than when it would have finished.
            self._live.pop(handle.request_id, None)
            if not handle.done():
                handle.cancel()

    def _submit(self, call: EngineCall) -> Any:
        return self._engine.submit(call.request)

    def cancel(self, request_id: str) -> bool:
        """Cancel a request if this replica runs it. The stream then ends with the engine's own
        cancelled result (with its real metrics)."""
        handle = self._live.get(request_id)
        if handle is None:
            return False
        handle.cancel()
        return True

    def stats(self) -> ReplicaSnapshot:
        return ReplicaSnapshot(self.replica, os.getpid(), process_rss_bytes(), self._engine.stats(), self._counters)

    def check_health(self) -> None:
        self._engine.stats()  # raises if the engine is gone

    def _count(self, **deltas: int) -> None:
        c = self._counters
        self._counters = dataclasses.replace(c, **{k: getattr(c, k) + v for k, v in deltas.items()})

    def __del__(self) -> None:
        # Serve calls this on a graceful stop, after in-flight requests have had
        # graceful_shutdown_timeout_s to finish.
        engine = getattr(self, "_engine", None)
        if engine is not None:
            self._engine = None
            engine.close(drain_timeout=self._drain_timeout)


def _cancel_submitted(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().cancel()
