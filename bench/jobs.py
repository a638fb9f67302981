"""Batch jobs: a chat-completions job through the OpenAI client, alone and beside live chats,
against closed-loop HTTP on the same server and the offline `cobatch batch` runner.

Each trial starts `cobatch serve` in a child process with a fresh data directory and measures,
in this order, on the same request bodies (short prompts, `--tokens` tokens each, ignore_eos so
every request generates exactly that many):

  closed loop  after a warm-up round, --concurrency workers send the first --baseline-requests bodies to
               /v1/chat/completions one after another: generated tokens / wall time
  idle TTFT    --probes streamed interactive chats one at a time on the idle server
  job alone    upload, create, poll until completed: generated tokens / (completed - created)
  job + chats  the same job again while one streamed interactive chat of --interactive-tokens
               arrives every --every seconds: the job's tok/s and the chats' TTFT
  offline      the server stopped, `cobatch batch` on the same file in its own process: its own
               tok/s (model loading excluded)

Targets (issue 31): job alone >= 0.95 of closed loop; chats' TTFT p95 <= 2x idle; offline >=
the job alone. Ratios are taken within a trial.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.http_targets import SpawnedServer
from bench.prompts import QUESTIONS, benchmark_prompts
from bench.record import RunRecord, add_common_arguments, run_trials
from bench.stats import percentile
from bench.table import markdown_table

ENDPOINT = "/v1/chat/completions"


def job_lines(model: str, n: int, tokens: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"job-{i}", "method": "POST", "url": ENDPOINT,
             "body": {"model": model, "max_tokens": tokens, "temperature": 0.7, "top_p": 0.9, "ignore_eos": True,
                      "messages": [{"role": "user", "content": prompt}]}}
            for i, prompt in enumerate(benchmark_prompts(n))]


async def closed_loop(url: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, float]:
    queue = iter(bodies)
    tokens = 0
    failed = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens, failed
        for body in queue:
            r = await client.post(url + ENDPOINT, json=body)
            if r.status_code == 200:
                tokens += r.json()["usage"]["completion_tokens"]
            else:
                failed += 1

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return {"tok_s": tokens / wall, "tokens": tokens, "seconds": wall, "failed": failed}


def chat_ttft(url: str, model: str, tokens: int, question: str) -> float | None:
    """Seconds to the first streamed content of one interactive chat (None if it failed)."""
    body = {"model": model, "max_tokens": tokens, "temperature": 0.7, "stream": True, "priority": "interactive",
            "ignore_eos": True, "messages": [{"role": "user", "content": question}]}
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", url + ENDPOINT, json=body, timeout=120) as r:
        if r.status_code != 200:
            return None
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    first = time.perf_counter() - start
    return first


def run_job(url: str, path: Path, every: float | None, model: str, chat_tokens: int) -> dict[str, Any]:
    """One job from upload to completed; with `every`, interactive chats arrive meanwhile."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with open(path, "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    created = time.perf_counter()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")
    done = threading.Event()
    ttfts: list[float] = []

    def chats() -> None:
        i = 0
        while not done.wait(every):
            ttft = chat_ttft(url, model, chat_tokens, QUESTIONS[i % len(QUESTIONS)])
            if ttft is not None and not done.is_set():
                ttfts.append(ttft)
            i += 1

    stream = threading.Thread(target=chats, daemon=True) if every else None
    if stream is not None:
        stream.start()
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.25)
    wall = time.perf_counter() - created
    done.set()
    if stream is not None:
        stream.join(180)
    if batch.status != "completed":
        raise RuntimeError(f"the job ended {batch.status}: {batch.errors}")
    lines = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    tokens = sum(x["response"]["body"]["usage"]["completion_tokens"] for x in lines)
    return {"tok_s": tokens / wall, "tokens": tokens, "seconds": wall, "completed": batch.request_counts.completed,
            "failed": batch.request_counts.failed, "ttft_s": ttfts}


def run_offline(args: argparse.Namespace, path: Path, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "server.cli", "batch", str(path), "-o", str(out), "--threads",
               str(args.threads), "--max-running", str(args.max_running), "--n-ctx", str(args.n_ctx)]
    if args.model:
        command += ["--model", args.model]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"cobatch batch failed ({proc.returncode}): {proc.stderr[-500:]}")
    rates = re.findall(r"([0-9.]+) tok/s", proc.stderr)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    tokens = sum(x["response"]["body"]["usage"]["completion_tokens"] for x in lines if x["response"]["status_code"] == 200)
    return {"tok_s": float(rates[-1]), "tokens": tokens, "seconds_with_load": wall}


def add_job_arguments(parser: argparse.ArgumentParser, *, requests: int, every: float) -> None:
    """The options of a benchmark that runs one batch job on a spawned server with chats beside it."""
    parser.add_argument("--requests", type=int, default=requests, help="requests of the batch job")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each job request generates")
    parser.add_argument("--every", type=float, default=every, help="seconds between chats during the job")
    parser.add_argument("--max-running", "--max-batch", type=int, default=32)
    parser.add_argument("--n-ctx", type=int, default=8192)


def one_trial(args: argparse.Namespace, trial: int, record: RunRecord) -> None:
    with tempfile.TemporaryDirectory(prefix="cobatch-bench-jobs-") as tmp:
        tmp_path = Path(tmp)
        server = SpawnedServer(args.model, args.threads, args.max_running, args.n_ctx,
                               ["--data-dir", str(tmp_path / "data")])
        with server:
            url = server.url
            model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
            lines = job_lines(model, args.requests, args.tokens)
            path = tmp_path / "job.jsonl"
            path.write_text("".join(json.dumps(x) + "\n" for x in lines))
            bodies = [x["body"] for x in lines]
            asyncio.run(closed_loop(url, bodies[: args.concurrency], args.concurrency))  # warm-up, not measured
            loop = asyncio.run(closed_loop(url, bodies[: args.baseline_requests], args.concurrency))
            idle = [t for i in range(args.probes)
                    if (t := chat_ttft(url, model, args.interactive_tokens, QUESTIONS[i % len(QUESTIONS)])) is not None]
            alone = run_job(url, path, None, model, args.interactive_tokens)
            beside = run_job(url, path, args.every, model, args.interactive_tokens)
        offline = run_offline(args, path, tmp_path / "offline.jsonl")
    record.trial(trial=trial, closed_loop=loop, idle_ttft_s=idle, job_alone=alone, job_with_chats=beside,
                 offline=offline)
    print(f"trial {trial}: closed loop {loop['tok_s']:.1f} tok/s, job {alone['tok_s']:.1f}, "
          f"job beside chats {beside['tok_s']:.1f}, offline {offline['tok_s']:.1f}", file=sys.stderr)


def report(record: RunRecord, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    rows = []
    ratios: dict[str, list[float]] = {"alone": [], "ttft": [], "offline": []}
    for t in record.trials:
        idle_p50 = statistics.median(t["idle_ttft_s"])
        chats = t["job_with_chats"]["ttft_s"]
        ttft_p95 = percentile(chats, 95)
        alone = t["job_alone"]["tok_s"] / t["closed_loop"]["tok_s"]
        offline = t["offline"]["tok_s"] / t["job_alone"]["tok_s"]
        ratios["alone"].append(alone)
        if chats:
            ratios["ttft"].append(ttft_p95 / idle_p50)
        ratios["offline"].append(offline)
        rows.append([t["trial"], t["closed_loop"]["tok_s"], t["job_alone"]["tok_s"], round(alone, 3),
                     t["job_with_chats"]["tok_s"], len(chats), round(1000 * idle_p50), round(1000 * ttft_p95),
                     round(ttft_p95 / idle_p50, 2), t["offline"]["tok_s"], round(offline, 3)])
    table = markdown_table(
        ["trial", "closed loop C tok/s", "job alone tok/s", "job / closed loop", "job beside chats tok/s",
         "chats", "idle TTFT p50 ms", "chats' TTFT p95 ms", "TTFT p95 / idle p50", "offline tok/s",
         "offline / job"], rows)

    def verdict(ok: bool) -> str:
        return "met" if ok else "missed"

    worst = {"alone": min(ratios["alone"]), "ttft": max(ratios["ttft"], default=float("nan")),
             "offline": min(ratios["offline"])}
    summary = (
        f"Batch jobs: {args.requests} chat completions of {args.tokens} tokens (ignore_eos) per job; closed loop "
        f"C={args.concurrency} over the first {args.baseline_requests} of the same bodies; interactive chats of "
        f"{args.interactive_tokens} tokens every {args.every} s beside the second job; server --max-running "
        f"{args.max_running}, --threads {args.threads}.\n\n{table}\n\n"
        f"Targets: job alone >= 0.95 of closed loop: {verdict(worst['alone'] >= 0.95)} (worst trial "
        f"{worst['alone']:.3f}); chats' TTFT p95 <= 2x idle: {verdict(worst['ttft'] <= 2.0)} (worst "
        f"{worst['ttft']:.2f}x); offline >= the job: {verdict(worst['offline'] >= 1.0)} (worst {worst['offline']:.3f})."
    )
    headline = {"job_vs_closed_loop": round(worst["alone"], 3), "ttft_p95_vs_idle": round(worst["ttft"], 2),
                "offline_vs_job": round(worst["offline"], 3)}
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cobatch bench jobs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, trials=1)
    add_job_arguments(parser, requests=2000, every=5.0)
    parser.add_argument("--baseline-requests", type=int, default=256, help="requests of the closed loop")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop workers")
    parser.add_argument("--interactive-tokens", type=int, default=32)
    parser.add_argument("--probes", type=int, default=8, help="interactive chats on the idle server")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.tokens, args.baseline_requests, args.concurrency = 24, 8, 12, 4
        args.every, args.interactive_tokens, args.probes, args.max_running, args.n_ctx = 0.5, 4, 2, 8, 2048
    run_trials("jobs", args, argv, one_trial, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
