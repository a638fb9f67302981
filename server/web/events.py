"""`GET /v1/engine/events`: the engine's published stats as a server-sent events stream, a few
snapshots a second, for the web page's live view.

It reads only what the engine thread already publishes (`Engine.stats()`, an immutable snapshot
replaced at every step), on the event loop: the engine does no work for a watcher. Each event
carries the steps run since the previous event (from the snapshot's recent step records), so
the page draws every step while it keeps up; and once a second the caller's most recent batch
jobs, with their request counts. The stream ends when the server starts shutting down, so an
open page never holds up a drain.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from engine.stats import EngineStats
from server.auth import caller_of
from server.context import ServerContext
from server.sse import EventStreamResponse, encode_event
from server.state import LOADING, OK

INTERVAL_S = 0.25  # four snapshots a second: smooth enough to watch, far slower than steps change
BATCHES_EVERY = 4  # events between two reads of the job store (once a second)
BATCHES_SHOWN = 8


async def engine_events(request: Request, ctx: ServerContext) -> Response:
    def error_event(error: Any) -> bytes:
        return encode_event(error.body(), event="error")

    return EventStreamResponse(_events(request, ctx), on_disconnect=lambda: None, error_event=error_event)


async def _events(request: Request, ctx: ServerContext) -> AsyncIterator[bytes]:
    jobs = request.app.state.jobs
    scope = caller_of(request).scope
    last_step = -1
    tick = 0
    while ctx.state.status in (LOADING, OK):
        payload: dict[str, Any] = {"status": ctx.state.status, "now": time.perf_counter()}
        engine = ctx.state.engine
        if ctx.state.status == OK and engine is not None:
            stats = engine.stats()
            payload.update(snapshot(stats, last_step))
            last_step = stats.steps
        if jobs is not None and tick % BATCHES_EVERY == 0:
            batches, _ = await jobs.db(jobs.store.batches, BATCHES_SHOWN, None, owner=scope)
            payload["batches"] = [_batch(b) for b in batches]
        yield encode_event(payload)
        tick += 1
        await asyncio.sleep(INTERVAL_S)


def snapshot(stats: EngineStats, after_step: int) -> dict[str, Any]:
    """The fields the live view draws; `steps` lists only the records after step `after_step`."""
    kv = stats.kv
    return {
        "running": stats.running,
        "tiers": {name: {"running": t.running, "waiting": t.waiting, "prompt_tokens": t.prompt_tokens,
                         "tokens_generated": t.tokens_generated, "finished": t.finished,
                         "suspensions": t.suspensions, "preemptions": t.preemptions}
                  for name, t in stats.tiers.items()},
        "kv": {"block_size": kv.block_size, "blocks_total": kv.blocks_total, "blocks_used": kv.blocks_used,
               "blocks_cached": kv.blocks_cached, "blocks_free": kv.blocks_free,
               "cells_used": stats.kv_cells_used, "cells_total": stats.kv_cells_total,
               "prefix_hit_tokens": kv.prefix_hit_tokens},
        "steps_total": stats.steps,
        "steps_interrupted": stats.steps_interrupted,
        "decode_threads": stats.decode_threads,
        "thread_switches": stats.thread_switches,
        "interactive_token_target_ms": stats.interactive_token_target_ms,
        "lane_first_tokens": stats.lane_first_tokens,
        "steps": [r._asdict() for r in stats.recent_steps if r.step > after_step],
    }


def _batch(batch: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "status", "endpoint", "created_at", "in_progress_at", "completed_at", "request_counts",
            "output_file_id", "error_file_id", "metadata")
    return {k: batch.get(k) for k in keys}
