"""`cobatch batch INPUT.jsonl -o OUTPUT.jsonl`: a batch file run in process, no HTTP server.

The same line format and the same request handling as a batch job on the server (each line
goes to its route in process; a body without "model" gets the loaded one), with every answer,
success or error, written to OUTPUT as soon as it arrives. Rerunning the same command after an
interruption skips the custom_ids OUTPUT already holds, so nothing is lost and nothing runs twice;
each line's id comes from its place in INPUT, so it is the same in every run. One run at a time
writes an OUTPUT (an exclusive lock on it): a second would run the same lines again.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, TextIO

from server.jobs.input_file import InputRequest, read_requests
from server.jobs.in_process import InProcessRoutes
from server.jobs.output_file import outcome_line
from server.state import FAILED, OK, STOPPED

_PROGRESS_EVERY_S = 0.5


def finished_ids(output: Path) -> set[str]:
    """custom_ids already in OUTPUT. A last line cut short by the interruption is removed."""
    if not output.exists():
        return set()
    data = output.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(output, "r+b") as f:
            f.truncate(len(whole))
    return {json.loads(line)["custom_id"] for line in whole.splitlines() if line.strip()}


def run_offline(input_path: Path, output_path: Path, app: Any, in_flight: int, progress: TextIO = sys.stderr) -> int:
    """Run every line not yet in OUTPUT through `app`'s routes; 0 when all are done."""
    requests, problems = read_requests(input_path, None)
    if problems:
        for p in problems:
            print(f"{input_path}: line {p.line}: {p.message}" if p.line else f"{input_path}: {p.message}", file=progress)
        return 2
    with open(output_path, "ab") as out:
        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # dropped with the file, or the process
        except BlockingIOError:
            print(f"{output_path} is being written by another `cobatch batch`: wait for it to end, or give "
                  "this run another -o", file=progress)
            return 2
        done = finished_ids(output_path)
        todo = [r for r in requests if r.custom_id not in done]
        if done:
            print(f"resuming: {len(done)} of {len(requests)} already in {output_path}", file=progress)
        return asyncio.run(_run(todo, len(requests), len(done), out, app, in_flight, progress))


async def _run(todo: list[InputRequest], total: int, done: int, out: BinaryIO, app: Any, in_flight: int,
               progress: TextIO) -> int:
    async with app.router.lifespan_context(app):
        await _until_ready(app)
        meter = _Progress(total, done, progress)  # from here: model loading is not the batch's speed
        routes = InProcessRoutes(app)
        model_id = app.state.ctx.state.model.model_id  # a line that names no model means this one
        queue = iter(todo)

        async def worker() -> None:
            for request in queue:
                outcome = None
                while outcome is None:  # "not now" (a full queue) cannot last: retry
                    outcome = await routes(request.url, {"model": model_id, **request.body})
                    if outcome is None:
                        await asyncio.sleep(0.1)
                out.write(outcome_line("offline", request.custom_id, request.index, outcome))
                out.flush()  # in the OS's hands: survives the process being killed
                usage = (outcome.response or {}).get("usage") or {}
                # chat and completions count completion_tokens; Responses and Messages output_tokens
                meter.advance(usage.get("completion_tokens", usage.get("output_tokens", 0)))

        await asyncio.gather(*(worker() for _ in range(max(1, in_flight))))
        os.fsync(out.fileno())
        await routes.close()
    meter.finish()
    return 0


async def _until_ready(app: Any) -> None:
    state = app.state.ctx.state
    while state.status != OK:
        if state.status in (FAILED, STOPPED):
            raise RuntimeError(f"the model did not load: {state.error or state.status}")
        await asyncio.sleep(0.05)


class _Progress:
    """done/total, generated tok/s and ETA on one line, redrawn at most twice a second."""

    def __init__(self, total: int, done: int, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.done, self.out, self.clock = total, done, out, clock
        self.started = clock()
        self.ran = 0
        self.tokens = 0
        self.shown = 0.0
        self.tty = out.isatty()

    def advance(self, tokens: int) -> None:
        self.done += 1
        self.ran += 1
        self.tokens += tokens
        now = self.clock()
        if now - self.shown >= (_PROGRESS_EVERY_S if self.tty else 10.0):
            self.shown = now
            self._draw(now)

    def finish(self) -> None:
        self._draw(self.clock())
        if self.tty:
            self.out.write("\n")

    def _draw(self, now: float) -> None:
        elapsed = max(1e-9, now - self.started)
        left = self.total - self.done
        eta = left * elapsed / self.ran if self.ran else 0.0
        text = (f"{self.done}/{self.total} ({100 * self.done / max(1, self.total):.0f}%)  "
                f"{self.tokens / elapsed:.1f} tok/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}")
        self.out.write(("\r" + text) if self.tty else (text + "\n"))
        self.out.flush()
