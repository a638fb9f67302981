"""Default tier: what a client that knows nothing of cobatch gets while a batch job runs.

`cobatch serve` (default flags: `--default-tier auto`) in a child process. Every chat is sent with
the `openai` client, streamed, exactly as a chat UI sends it: no extra field ("default"), or
with `service_tier="flex"` ("flex"), the same chat otherwise. Per trial, in this order:

  idle     --probes default chats one at a time on the idle server: TTFT
  job      a batch job of --requests chat completions (--tokens tokens each) through /v1/batches;
           while it runs, one chat every --every seconds, default and flex alternating: TTFT

Targets (issue 47): the default chats' TTFT p95 during the job <= 2x the idle TTFT p95 of the
same trial, and every default chat served in the interactive tier (`service_tier` "priority" in
its chunks); the flex chats show what the same chat got when it was batch work.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.http_targets import SpawnedServer
from bench.jobs import ENDPOINT, add_job_arguments, job_lines
from bench.prompts import QUESTIONS
from bench.record import RunRecord, add_common_arguments, run_trials
from bench.stats import percentile
from bench.table import markdown_table

KINDS = ("default", "flex")


def chat_ttft(client: Any, model: str, tokens: int, question: str, kind: str) -> tuple[float, str] | None:
    """Seconds to the first streamed content and the tier the chunks name (None: it failed)."""
    extra = {"service_tier": "flex"} if kind == "flex" else {}
    start = time.perf_counter()
    first, tier = None, ""
    try:
        stream = client.chat.completions.create(model=model, max_tokens=tokens, stream=True,
                                                messages=[{"role": "user", "content": question}], **extra)
        for chunk in stream:
            tier = chunk.service_tier or tier
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
    except Exception as exc:  # a failed chat is reported, not measured
        print(f"{kind} chat failed: {exc}", file=sys.stderr)
        return None
    return (first, tier) if first is not None else None


def one_trial(args: argparse.Namespace, trial: int, record: RunRecord) -> None:
    import openai

    with tempfile.TemporaryDirectory(prefix="cobatch-bench-tier-") as tmp:
        server = SpawnedServer(args.model, args.threads, args.max_running, args.n_ctx,
                               ["--data-dir", str(Path(tmp) / "data")])
        with server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
            model = client.models.list().data[0].id
            chat_ttft(client, model, args.chat_tokens, QUESTIONS[0], "default")  # warm-up, not measured
            idle = [m for i in range(args.probes)
                    if (m := chat_ttft(client, model, args.chat_tokens, QUESTIONS[i % len(QUESTIONS)], "default"))]
            path = Path(tmp) / "job.jsonl"
            path.write_text("".join(json.dumps(x) + "\n" for x in job_lines(model, args.requests, args.tokens)))
            started = time.perf_counter()
            during = run_job_with_chats(client, path, model, args)
            job_s = time.perf_counter() - started
    record.trial(trial=trial, idle=[{"ttft_s": t, "tier": tier} for t, tier in idle], during=during,
                 job_s=round(job_s, 2))
    print(f"trial {trial}: idle TTFT p95 {percentile([t for t, _ in idle], 95):.3f} s; during the job: "
          + ", ".join(f"{k} p95 {percentile(_ttfts(during, k), 95):.3f} s ({len(_ttfts(during, k))})" for k in KINDS),
          file=sys.stderr)


def run_job_with_chats(client: Any, path: Path, model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")
    done = threading.Event()
    during: list[dict[str, Any]] = []

    def chats() -> None:
        i = 0
        while not done.wait(args.every):
            kind = KINDS[i % 2]
            measured = chat_ttft(client, model, args.chat_tokens, QUESTIONS[(i // 2) % len(QUESTIONS)], kind)
            if measured is not None and not done.is_set():  # only chats wholly inside the job count
                during.append({"kind": kind, "ttft_s": measured[0], "tier": measured[1]})
            i += 1

    sender = threading.Thread(target=chats, daemon=True)
    sender.start()
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.5)
    done.set()
    sender.join(600)
    if batch.status != "completed":
        raise RuntimeError(f"the job ended {batch.status}: {batch.errors}")
    return during


def _ttfts(during: list[dict[str, Any]], kind: str) -> list[float]:
    return [c["ttft_s"] for c in during if c["kind"] == kind]


def report(record: RunRecord, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    rows, ratios, tiers_ok = [], [], True
    for t in record.trials:
        idle = [c["ttft_s"] for c in t["idle"]]
        idle_p95 = percentile(idle, 95)
        default, flex = _ttfts(t["during"], "default"), _ttfts(t["during"], "flex")
        tiers_ok &= all(c["tier"] == "priority" for c in t["idle"] + t["during"] if c.get("kind", "default") == "default")
        tiers_ok &= all(c["tier"] == "flex" for c in t["during"] if c["kind"] == "flex")
        ratio = percentile(default, 95) / idle_p95 if default else float("nan")
        ratios.append(ratio)
        rows.append([t["trial"], round(1000 * statistics.median(idle)), round(1000 * idle_p95), len(default),
                     round(1000 * percentile(default, 95)) if default else "-", round(ratio, 2), len(flex),
                     round(1000 * percentile(flex, 95)) if flex else "-",
                     round(percentile(flex, 95) / idle_p95, 1) if flex else "-", t.get("job_s", "-")])
    table = markdown_table(["trial", "idle TTFT p50 ms", "idle TTFT p95 ms", "default chats", "default TTFT p95 ms",
                            "default p95 / idle p95", "flex chats", "flex TTFT p95 ms", "flex p95 / idle p95",
                            "job s (upload to completed)"], rows)
    worst = max(ratios)
    summary = (
        f"Default tier: the openai client's streamed chats ({args.chat_tokens} tokens) with no extra field "
        f"(default) and with service_tier=\"flex\", one every {args.every} s alternating, during a batch job of "
        f"{args.requests} chat completions of {args.tokens} tokens; `cobatch serve` with default flags, "
        f"--max-running {args.max_running}, --threads {args.threads}.\n\n{table}\n\n"
        f"Target: default chats' TTFT p95 <= 2x idle TTFT p95: {'met' if worst <= 2.0 else 'missed'} (worst trial "
        f"{worst:.2f}x); every default chat served as \"priority\" and every flex chat as \"flex\": "
        f"{'yes' if tiers_ok else 'no'}."
    )
    return summary, {"default_ttft_p95_vs_idle_p95": round(worst, 2), "tiers_as_asked": tiers_ok}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cobatch bench default-tier", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, trials=2)
    add_job_arguments(parser, requests=300, every=2.0)
    parser.add_argument("--chat-tokens", type=int, default=16, help="max_tokens of each chat")
    parser.add_argument("--probes", type=int, default=10, help="chats on the idle server")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.tokens, args.every, args.chat_tokens, args.probes = 24, 8, 0.3, 4, 2
        args.max_running, args.n_ctx, args.trials = 8, 2048, 1
    run_trials("default-tier", args, argv, one_trial, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
