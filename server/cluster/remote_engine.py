"""The ingress's engine: what server/app.py needs from an Engine (model, n_ctx, submit, stats,
close), served by the engine replicas through a Ray Serve DeploymentHandle.

Tokenizing and chat rendering stay in the ingress (the HTTP layer does them before submit), so
the ingress loads the model file too (memory-mapped: the weights' pages are shared with replicas
on the same machine, and no context is created). Each request's stream is pumped by one asyncio
loop on a thread of its own into an engine RequestHandle, which fans it out to the app's readers.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from ray.serve.exceptions import RequestCancelledError

from bindings import Model
from engine import REFUSALS, EngineClosedError, FinishReason, GenerationResult, Request, RequestHandle, RequestMetrics
from engine.model_source import resolve_model
from server.cluster.messages import Accepted, EngineCall, Rejected
from server.cluster.replica_stats import ReplicaSnapshot, sum_stats
from server.context import THREAD_JOIN_BACKSTOP_S

log = logging.getLogger("cobatch.cluster")

# A cancel first asks the replica (the stream then ends with the engine's real result); if the
# stream has not ended after this long, the call itself is cancelled.
_SOFT_CANCEL_GRACE_S = 5.0


class RemoteEngine:
    def __init__(self, handle: Any, model_path: str | None, *, replicas: int = 1, stats_interval: float = 1.0,
                 startup_timeout: float = 600.0) -> None:
        self._handle = handle
        self._stream_handle = handle.options(stream=True)
        self._stats_interval = stats_interval
        self._accepting = True
        self._streams: dict[str, tuple[Any, RequestHandle]] = {}  # request id -> (response generator, handle)
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cobatch-cluster-pump", daemon=True)
        self._thread.start()
        self.model = Model(resolve_model(model_path))
        try:
            # Blocks until every replica answers: /health says "loading" until then.
            self._snapshots: list[ReplicaSnapshot] = self._run(self._await_replicas(replicas, startup_timeout))
            self.n_ctx: int = min(s.engine.kv_cells_total for s in self._snapshots)
        except BaseException:
            self._stop_loop()
            self.model.close()
            raise
        self._stats_task = asyncio.run_coroutine_threadsafe(self._refresh_stats(), self._loop)

    # ---- the engine surface the app uses ----------------------------------------------------
    def submit(self, request: Request) -> RequestHandle:
        """Route the request to a replica and wait for it to be accepted there; raises the
        engine's own refusals (REFUSALS). Blocking: the app calls it from a worker thread."""
        if not self._accepting:
            raise EngineClosedError("the engine is shutting down")
        call = EngineCall.of(request)
        started = time.perf_counter()
        try:
            stream, accepted = self._run(self._open(call))
        except tuple(REFUSALS.values()):
            raise
        except Exception as exc:
            raise EngineClosedError(f"no engine replica could take the request: {type(exc).__name__}: {exc}") from exc
        handle = RequestHandle(request.request_id, accepted.prompt_tokens, self._cancel)
        with self._lock:
            self._streams[request.request_id] = (stream, handle)
        self._loop.call_soon_threadsafe(self._spawn, self._pump(stream, handle, accepted, started))
        return handle

    def submit_many(self, requests: list[Request]) -> list[RequestHandle]:
        """Each to its own replica, in turn; on a refusal the ones already accepted are cancelled,
        so none stays queued (they may have computed a step or two)."""
        handles: list[RequestHandle] = []
        try:
            for request in requests:
                handles.append(self.submit(request))
        except BaseException:
            for handle in handles:
                handle.cancel()
            raise
        return handles

    def stats(self) -> Any:
        """The sum over replicas of their engines' stats, as of the last poll (every
        stats_interval seconds): the single-process /health and /metrics read it unchanged."""
        return sum_stats([s.engine for s in self._snapshots])

    def replica_stats(self) -> list[ReplicaSnapshot]:
        return list(self._snapshots)

    def close(self, drain_timeout: float = 0.0) -> None:
        """Stop accepting; give running requests drain_timeout seconds, then cancel the rest.
        The replicas stay up: Serve owns them."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._streams and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            left = [handle for _, handle in self._streams.values()]
        for handle in left:
            handle.cancel()
        while self._streams and time.monotonic() < deadline + _SOFT_CANCEL_GRACE_S + 5.0:
            time.sleep(0.02)
        self._stats_task.cancel()
        self._stop_loop()
        self.model.close()

    # ---- the pump loop ----------------------------------------------------------------------
    def _run(self, coroutine: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _open(self, call: EngineCall) -> tuple[Any, Accepted]:
        stream = self._stream_handle.generate.remote(call)
        try:
            first = await stream.__anext__()
        except BaseException:
            stream.cancel()
            raise
        if isinstance(first, Rejected):
            raise first.error()
        if not isinstance(first, Accepted):
            stream.cancel()
            raise RuntimeError(f"engine replica answered {type(first).__name__} before accepting")
        return stream, first

    async def _pump(self, stream: Any, handle: RequestHandle, accepted: Accepted, started: float) -> None:
        ended = False
        try:
            async for item in stream:
                if isinstance(item, str):
                    handle.publish_delta(item)
                elif isinstance(item, GenerationResult):
                    handle.publish_result(item)
                    ended = True
        except RequestCancelledError:
            self._lose(handle, accepted, started, FinishReason.CANCELLED, "cancelled")
        except Exception as exc:  # the replica died, or the stream broke
            log.warning("request %s on replica %s failed: %s", handle.request_id, accepted.replica, exc)
            self._lose(handle, accepted, started, FinishReason.ERROR,
                       f"the engine replica serving this request failed ({type(exc).__name__}); "
                       "other requests are unaffected, retry it")
        finally:
            if not ended:
                stream.cancel()
            if not handle.done():
                self._lose(handle, accepted, started, FinishReason.ERROR, "the engine replica ended the stream early")
            with self._lock:
                self._streams.pop(handle.request_id, None)

    def _lose(self, handle: RequestHandle, accepted: Accepted, started: float, reason: FinishReason,
              error: str) -> None:
        """The result of a request whose replica never sent one: only what the ingress saw is
        known (the prompt's size from the replica's acceptance, the time; nothing generated)."""
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        metrics = RequestMetrics(
            prompt_tokens=accepted.prompt_tokens, tokens_generated=0, queue_time_ms=elapsed_ms, ttft_ms=None,
            generation_time_ms=0.0, latency_ms=elapsed_ms, tokens_per_second=0.0,
        )
        handle.publish_result(GenerationResult(handle.request_id, handle.streamed_text(), (), reason, metrics, error))

    def _cancel(self, request_id: str) -> None:
        """RequestHandle's canceller (any thread): ask the replicas, then cut the call."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._spawn, self._cancel_async(request_id))

    async def _cancel_async(self, request_id: str) -> None:
        try:
            await self._handle.broadcast("cancel", request_id).results_async(
                timeout_s=_SOFT_CANCEL_GRACE_S, return_exceptions=True)
        except Exception as exc:  # no replica reachable: the hard cancel below still runs
            log.info("soft cancel of %s failed: %s", request_id, exc)
        deadline = time.monotonic() + _SOFT_CANCEL_GRACE_S
        while request_id in self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        with self._lock:
            entry = self._streams.get(request_id)
        if entry is not None:
            entry[0].cancel()  # the replica's generate() gets CancelledError and frees the sequence

    def _spawn(self, coroutine: Any) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _await_replicas(self, expected: int, timeout: float) -> list[ReplicaSnapshot]:
        """Snapshots of the replicas once `expected` of them answer (or at least one has when
        the timeout ends): Serve starts the ingress while the replicas are still loading."""
        deadline = time.monotonic() + timeout
        snapshots: list[ReplicaSnapshot] = []
        while time.monotonic() < deadline:
            try:
                snapshots = await self._poll_stats()
            except Exception as exc:  # DeploymentUnavailableError until the first replica runs
                log.debug("waiting for engine replicas: %s", exc)
            if len(snapshots) >= expected:
                return snapshots
            await asyncio.sleep(0.5)
        if not snapshots:
            raise RuntimeError(f"no engine replica answered within {timeout:.0f} s")
        return snapshots

    async def _poll_stats(self) -> list[ReplicaSnapshot]:
        results = await self._handle.broadcast("stats").results_async(return_exceptions=True)
        return [r for r in results if isinstance(r, ReplicaSnapshot)]

    async def _refresh_stats(self) -> None:
        while True:
            await asyncio.sleep(self._stats_interval)
            try:
                snapshots = await self._poll_stats()
            except Exception as exc:  # keep the last snapshot; /health shows its replicas
                log.info("replica stats poll failed: %s", exc)
                continue
            if snapshots:
                self._snapshots = snapshots

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(THREAD_JOIN_BACKSTOP_S)
        self._loop.close()
