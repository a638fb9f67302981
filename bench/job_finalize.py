"""A large batch job's finalize: process memory while its output files are written, and live chats' TTFT beside it.

Each trial prepares a data directory holding one chat-completions batch of --lines requests, then
starts `cobatch serve` on it in a child process. The results of all but the last --pending
requests are pre-recorded: inserted straight into the job store (as the runner would have
committed them, a chat.completion body of about --answer-chars characters each) before the
server starts, because the point is finalize, not generation. The server runs the --pending real
requests first (--pending-tokens tokens each), then finds every line answered and finalizes: it
writes the output file from the store, page by page.

Measured in the same run, on the same server:
  RSS         /health's process RSS, polled every 50 ms: its peak while the batch is finalizing,
              against the last sample before (the growth is what finalizing costs)
  TTFT during streamed interactive chats of --chat-tokens tokens, one after another, that start
              and end while the batch is finalizing
  TTFT idle   --probes of the same chats once the batch has completed, the server idle

Targets (issue 46): RSS growth under --memory-bound-mib whatever the output's size; chats' TTFT
p95 during the finalize within 2x the idle p95.
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.http_targets import SpawnedServer
from bench.jobs import ENDPOINT, chat_ttft
from bench.prompts import QUESTIONS, benchmark_prompts
from bench.record import RunRecord, add_common_arguments, run_trials
from bench.stats import percentile
from bench.table import markdown_table

_MET = {True: "met", False: "missed"}
_WORDS = ("the", "batch", "answer", "model", "token", "line", "store", "result", "file", "chat", "server", "kernel")


def recorded_answer(i: int, chars: int, model: str) -> dict[str, Any]:
    """A chat.completion body like those the runner stores, its text different for every line."""
    words, n = [], i
    while sum(len(w) + 1 for w in words) < chars:
        words.append(_WORDS[n % len(_WORDS)])
        n = n * 7 + 3
    text = " ".join(words)[:chars]
    return {"id": f"chatcmpl-{i:08x}", "object": "chat.completion", "created": 1_800_000_000, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length",
                         "logprobs": None}],
            "usage": {"prompt_tokens": 24, "completion_tokens": len(words), "total_tokens": 24 + len(words)}}


def prepare(data_dir: Path, args: argparse.Namespace, model: str) -> str:
    """The batch, its requests, and every result but the last --pending, written straight into the store."""
    from server.jobs.store import JobStore

    store = JobStore(data_dir)
    prompts = benchmark_prompts(args.lines)
    lines = [{"custom_id": f"job-{i}", "method": "POST", "url": ENDPOINT,
              "body": {"model": model, "max_tokens": args.pending_tokens, "temperature": 0.7, "ignore_eos": True,
                       "messages": [{"role": "user", "content": prompts[i]}]}} for i in range(args.lines)]
    uploaded = store.add_file("batch", "job.jsonl", [("".join(json.dumps(x) + "\n" for x in lines)).encode()])
    batch_id = store.add_batch(ENDPOINT, uploaded.id, 24 * 3600, "24h", None)
    store.start(batch_id, ((x["custom_id"], x["body"]) for x in lines))
    store.close()
    db = sqlite3.connect(data_dir / "jobs.sqlite3", isolation_level=None)
    db.execute("BEGIN")
    db.executemany("UPDATE requests SET status_code = 200, request_id = ?, response = ? WHERE batch_id = ? AND line = ?",
                   ((f"req-{i}", json.dumps(recorded_answer(i, args.answer_chars, model)), batch_id, i)
                    for i in range(args.lines - args.pending)))
    db.execute("COMMIT")
    db.close()
    return batch_id


class Watch:
    """Polls /health (RSS, every 50 ms) and the batch (status, every 250 ms) until the batch ends."""

    def __init__(self, url: str, batch_id: str) -> None:
        self.url, self.batch_id = url, batch_id
        self.rss: list[tuple[float, int]] = []
        self.finalizing_at: float | None = None
        self.completed_at: float | None = None
        self.status = ""
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            next_batch = 0.0
            while not self.done.is_set():
                now = time.monotonic()
                self.rss.append((now, client.get("/health").json()["process"]["rss_bytes"]))
                if now >= next_batch:
                    status = client.get(f"/v1/batches/{self.batch_id}").json()["status"]
                    if status == "finalizing" and self.finalizing_at is None:
                        self.finalizing_at = time.monotonic()
                    if status in ("completed", "failed", "expired", "cancelled"):
                        self.completed_at = time.monotonic()
                        if self.finalizing_at is None:  # finalizing came and went between two polls
                            self.finalizing_at = now
                        self.status = status
                        self.done.set()
                    next_batch = now + 0.25  # as a client polling its batch would
                time.sleep(0.05)


def one_trial(args: argparse.Namespace, trial: int, record: RunRecord) -> None:
    with tempfile.TemporaryDirectory(prefix="cobatch-bench-finalize-") as tmp:
        data_dir = Path(tmp) / "data"
        model = Path(args.model).stem if args.model else _default_model_id()
        started = time.perf_counter()
        batch_id = prepare(data_dir, args, model)
        prepared_s = time.perf_counter() - started
        server = SpawnedServer(args.model, args.threads, args.max_running, args.n_ctx,
                               ["--data-dir", str(data_dir), "--model-id", model])
        with server:
            url = server.url
            watch = Watch(url, batch_id)
            watcher = threading.Thread(target=watch.run, daemon=True)
            watcher.start()
            chats: list[tuple[float, float, float]] = []  # (start, end, ttft)
            i = 0
            while not watch.done.is_set():
                start = time.monotonic()
                ttft = chat_ttft(url, model, args.chat_tokens, QUESTIONS[i % len(QUESTIONS)])
                if ttft is not None:
                    chats.append((start, time.monotonic(), ttft))
                i += 1
            watcher.join(30)
            idle = [t for j in range(args.probes)
                    if (t := chat_ttft(url, model, args.chat_tokens, QUESTIONS[j % len(QUESTIONS)])) is not None]
            batch = httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30).json()
            output_bytes = httpx.get(f"{url}/v1/files/{batch['output_file_id']}", timeout=30).json()["bytes"]
    if watch.status != "completed" or batch["request_counts"]["completed"] != args.lines:
        raise RuntimeError(f"the batch ended {watch.status}: {batch['request_counts']} {batch.get('errors')}")
    begin, end = watch.finalizing_at, watch.completed_at
    before = [rss for t, rss in watch.rss if t < begin]
    during = [rss for t, rss in watch.rss if begin <= t <= end]
    record.trial(trial=trial, lines=args.lines, prepared_s=prepared_s, output_bytes=output_bytes,
                 finalize_s=end - begin, rss_before=before[-1], rss_peak=max(during or before[-1:]),
                 rss_samples=len(during), ttft_during_s=[c[2] for c in chats if c[0] >= begin and c[1] <= end],
                 ttft_before_s=[c[2] for c in chats if c[1] < begin], ttft_idle_s=idle)
    t = record.trials[-1]
    print(f"trial {trial}: finalize {t['finalize_s']:.1f} s, output {output_bytes / 2**20:.0f} MiB, RSS "
          f"+{(t['rss_peak'] - t['rss_before']) / 2**20:.1f} MiB, {len(t['ttft_during_s'])} chats during",
          file=sys.stderr)


def _default_model_id() -> str:
    from engine.model_source import default_model_path

    return Path(str(default_model_path())).stem


def _ms(seconds: float) -> int | None:
    return None if seconds != seconds else round(1000 * seconds)


def report(record: RunRecord, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    rows = []
    worst_growth, ratios = 0.0, []
    for t in record.trials:
        growth = (t["rss_peak"] - t["rss_before"]) / 2**20
        during, idle = t["ttft_during_s"], t["ttft_idle_s"]
        p95_during, p95_idle = percentile(during, 95), percentile(idle, 95)
        ratio = p95_during / p95_idle  # NaN when no chat fitted inside the finalize (--quick)
        worst_growth = max(worst_growth, growth)
        ratios += [ratio] if ratio == ratio else []
        rows.append([t["trial"], t["lines"], round(t["output_bytes"] / 2**20, 1), round(t["finalize_s"], 2),
                     round(t["rss_before"] / 2**20), round(growth, 1), len(during), _ms(p95_during),
                     _ms(statistics.median(during) if during else float("nan")), len(idle), _ms(p95_idle),
                     _ms(statistics.median(idle) if idle else float("nan")), round(ratio, 2) if ratio == ratio else None])
    table = markdown_table(
        ["trial", "lines", "output MiB", "finalize s", "RSS before MiB", "RSS growth MiB", "chats during",
         "TTFT p95 during ms", "p50 during ms", "idle chats", "idle TTFT p95 ms", "idle p50 ms",
         "p95 during / idle p95"], rows)

    summary = (
        f"Finalize of a {args.lines}-line chat-completions batch (results of all but {args.pending} pre-recorded "
        f"in the store, about {args.answer_chars} characters of answer each); interactive chats of "
        f"{args.chat_tokens} tokens one after another during it, then {args.probes} on the idle server; "
        f"server --max-running {args.max_running}, --threads {args.threads}.\n\n{table}\n\n"
        f"Targets: RSS growth while finalizing under {args.memory_bound_mib} MiB: "
        f"{_MET[worst_growth < args.memory_bound_mib]} (worst {worst_growth:.1f} MiB); chats' TTFT p95 during "
        f"the finalize within 2x idle p95: "
        + (f"{_MET[max(ratios) <= 2.0]} (worst {max(ratios):.2f}x)." if ratios else "not measured (no chat fitted "
           "inside the finalize).")
    )
    headline = {"rss_growth_mib": round(worst_growth, 1),
                "ttft_p95_vs_idle": round(max(ratios), 2) if ratios else None, "lines": args.lines}
    return summary, headline


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cobatch bench job-finalize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, trials=3)
    parser.add_argument("--lines", type=int, default=100_000, help="requests in the batch")
    parser.add_argument("--pending", type=int, default=16, help="requests the server runs before finalizing")
    parser.add_argument("--pending-tokens", type=int, default=32, help="tokens each of those generates")
    parser.add_argument("--answer-chars", type=int, default=400, help="characters of each pre-recorded answer")
    parser.add_argument("--chat-tokens", type=int, default=2, help="tokens of each interactive chat (few: "
                        "more chats fit inside a finalize)")
    parser.add_argument("--probes", type=int, default=30, help="interactive chats on the idle server")
    parser.add_argument("--memory-bound-mib", type=float, default=64.0, help="the RSS growth target")
    parser.add_argument("--max-running", "--max-batch", type=int, default=16)
    parser.add_argument("--n-ctx", type=int, default=4096)
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.pending, args.pending_tokens, args.probes, args.max_running, args.n_ctx = 3000, 4, 4, 4, 4, 1024
        args.trials = 1
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = arguments(argv)
    # each trial: a fresh data directory and server
    record = run_trials("job-finalize", args, argv, one_trial, report)
    return 0 if record.trials else 1


if __name__ == "__main__":
    sys.exit(main())
