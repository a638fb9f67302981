"""Process memory and the /health payload."""
from __future__ import annotations

import os
import resource
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # state imports this module's process_rss_bytes
    from server.state import ServingState

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss_bytes() -> int:
    """Current resident set size. /proc/self/statm's second field is resident pages; where /proc
    is missing, fall back to the peak RSS from getrusage (the best the OS offers there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def health_payload(state: ServingState, jobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The /health body; `jobs` is the job runner's own account (server/jobs/runner.py's health),
    shown as is: a paused store says so here with its reason."""
    payload: dict[str, Any] = {
        "status": state.status,
        "model": None,
        "process": {"pid": os.getpid(), "rss_bytes": process_rss_bytes()},
        "uptime_s": round(time.monotonic() - state.started_at, 3),
        "http_requests_in_flight": state.in_flight,
    }
    if state.error:
        payload["error"] = state.error
    if jobs is not None:
        payload["jobs"] = jobs
    if state.model is not None:
        payload["model"] = {
            "id": state.model.model_id,
            "description": state.model.description,
            "file": state.model.file_name,
            "chat_style": state.model.chat_style,
        }
    if state.engine is not None:
        stats = state.engine.stats()
        payload["queue"] = dict(stats.waiting)
        payload["running"] = stats.running
        payload["kv"] = {
            "cells_used": stats.kv_cells_used,
            "cells_total": stats.kv_cells_total,
            "usage": round(stats.kv_cells_used / stats.kv_cells_total, 6) if stats.kv_cells_total else 0.0,
        }
        kv = stats.kv
        payload["kv"]["blocks"] = {
            "size": kv.block_size, "total": kv.blocks_total, "used": kv.blocks_used,
            "cached": kv.blocks_cached, "free": kv.blocks_free,
        }
        payload["suspensions"] = stats.suspensions
        payload["preemptions"] = stats.preemptions
        payload["steps"] = stats.steps
        payload["tokens_forced"] = stats.tokens_forced
        payload["decode_threads"] = stats.decode_threads
        payload["thread_switches"] = stats.thread_switches
        spec = stats.speculation
        if spec is not None:
            payload["speculation"] = {"drafted": dict(spec.drafted), "accepted": dict(spec.accepted),
                                      "steps_with_drafts": spec.steps_with_drafts, "verified_rows": spec.verified_rows}
    return payload
