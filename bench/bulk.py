"""Bulk requests against their one-by-one equivalents, through `cobatch serve` over HTTP:
n = 8 choices in one request against 8 simultaneous requests, and a 64-prompt list against 64
concurrent single requests, trials interleaved in one run.

  n=8          /v1/completions with a ~--prompt-tokens prompt, n 8, temperature 0.8, --tokens
               tokens each (ignore_eos): wall time, prompt tokens prefilled (the server's
               cobatch_tokens_prefilled counter), usage.prompt_tokens
  8 separate   the same work as 8 simultaneous requests with n 1 (they share the prompt through
               the prefix cache's leader): wall time, tokens prefilled
  list of 64   one /v1/completions with 64 short prompts, --list-tokens tokens each: tok/s
  64 singles   the same 64 prompts as 64 concurrent requests: tok/s

Every case gets prompts no earlier case has seen (a tag in front), so none is served from the
cache another left. Targets (issue 33): n=8 time <= 1.1x the 8 separate requests, with the
prompt prefilled once and counted once in usage; the list's tok/s within 5% of the singles'.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.http_targets import SpawnedServer
from bench.prompts import TOPICS, benchmark_prompts
from bench.record import RunRecord, add_common_arguments, publish_report
from bench.table import markdown_table


def long_prompt(tag: str, n_tokens: int) -> str:
    """About n_tokens tokens of varied prose (a dozen tokens per sentence), opening with tag."""
    sentences = [f"Chapter notes on {TOPICS[i % len(TOPICS)]}, paragraph {i}." for i in range(n_tokens // 12 + 1)]
    return f"[{tag}] " + " ".join(sentences) + "\nSummary:"


def prefilled(client: httpx.Client) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name in ("cobatch_tokens_prefilled_total", "cobatch_tokens_prefilled"):
                return sample.value
    raise RuntimeError("the server reports no cobatch_tokens_prefilled")


async def post_all(url: str, bodies: list[dict[str, Any]]) -> tuple[float, list[dict[str, Any]]]:
    """Send every body at once; wall seconds and the replies (all must be 200)."""
    async with httpx.AsyncClient(base_url=url, timeout=None,
                                 limits=httpx.Limits(max_connections=len(bodies))) as client:
        start = time.perf_counter()
        replies = await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))
        wall = time.perf_counter() - start
    for r in replies:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    return wall, [r.json() for r in replies]


def case(url: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=30) as client:
        before = prefilled(client)
        wall, replies = asyncio.run(post_all(url, bodies))
        after = prefilled(client)
    completion = sum(r["usage"]["completion_tokens"] for r in replies)
    return {"seconds": wall, "prefilled": after - before, "completion_tokens": completion,
            "prompt_tokens_in_usage": sum(r["usage"]["prompt_tokens"] for r in replies),
            "choices": sum(len(r["choices"]) for r in replies), "tok_s": completion / wall}


def trial(url: str, model: str, index: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    sample = {"model": model, "temperature": 0.8, "top_p": 1.0, "ignore_eos": True}
    n = args.n
    forked = {**sample, "prompt": long_prompt(f"t{index} n", args.prompt_tokens), "n": n, "max_tokens": args.tokens}
    separate = [{**sample, "prompt": long_prompt(f"t{index} s", args.prompt_tokens), "max_tokens": args.tokens,
                 "seed": index * 1000 + i} for i in range(n)]
    prompts = [f"[t{index} l] {p}" for p in benchmark_prompts(args.prompts)]
    singles_prompts = [f"[t{index} c] {p}" for p in benchmark_prompts(args.prompts)]
    listed = {**sample, "prompt": prompts, "max_tokens": args.list_tokens}
    singles = [{**sample, "prompt": p, "max_tokens": args.list_tokens} for p in singles_prompts]
    cases = [("n", [forked]), ("separate", separate), ("list", [listed]), ("singles", singles)]
    if index % 2:  # the machine's speed drifts: alternate which of each pair goes first
        cases = [cases[1], cases[0], cases[3], cases[2]]
    rows = []
    for name, bodies in cases:
        row = {"trial": index, "case": name, **case(url, bodies)}
        print(f"trial {index} {name}: {row['seconds']:.2f} s, {row['tok_s']:.1f} tok/s, "
              f"prefilled {row['prefilled']:.0f}", file=sys.stderr)
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    trials = sorted({r["trial"] for r in rows})
    by = {(r["trial"], r["case"]): r for r in rows}
    time_ratio = [by[t, "n"]["seconds"] / by[t, "separate"]["seconds"] for t in trials]
    tok_ratio = [by[t, "list"]["tok_s"] / by[t, "singles"]["tok_s"] for t in trials]
    med = lambda name, key: statistics.median(by[t, name][key] for t in trials)  # noqa: E731
    table = markdown_table(
        ["case", "requests", "choices", "seconds", "completion tok/s", "prompt tokens prefilled", "usage.prompt_tokens"],
        [[name, requests, int(med(name, "choices")), med(name, "seconds"), med(name, "tok_s"),
          int(med(name, "prefilled")), int(med(name, "prompt_tokens_in_usage"))]
         for name, requests in (("n", 1), ("separate", args.n), ("list", 1), ("singles", args.prompts))])
    n_time, list_tok = statistics.median(time_ratio), statistics.median(tok_ratio)
    summary = (
        f"{len(trials)} trial(s), cases interleaved (each pair's order alternating); medians over trials. "
        f"n={args.n} and {args.n} separate requests: a ~{args.prompt_tokens}-token prompt, {args.tokens} tokens "
        f"per choice at temperature 0.8; list and singles: {args.prompts} short prompts, {args.list_tokens} "
        f"tokens each.\n\n{table}\n\n"
        f"- n={args.n} time / {args.n} separate requests' time, per trial: "
        f"{', '.join(f'{x:.3f}' for x in time_ratio)} (median {n_time:.3f}; target <= 1.1: "
        f"{'met' if n_time <= 1.1 else 'missed'})\n"
        f"- list tok/s / singles' tok/s, per trial: {', '.join(f'{x:.3f}' for x in tok_ratio)} "
        f"(median {list_tok:.3f}; target >= 0.95: {'met' if list_tok >= 0.95 else 'missed'})")
    headline = {"n_time_ratio": round(n_time, 3), "list_tok_s_ratio": round(list_tok, 3),
                "n_prefilled": int(med("n", "prefilled")), "n_usage_prompt_tokens": int(med("n", "prompt_tokens_in_usage"))}
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench bulk", description=__doc__)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per choice in the n cases")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--list-tokens", type=int, default=32, help="tokens per prompt in the list cases")
    parser.add_argument("--max-running", type=int, default=64)
    add_common_arguments(parser, trials=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.prompt_tokens, args.tokens, args.prompts, args.list_tokens, args.trials = 2, 64, 4, 4, 4, 1
    record = RunRecord("bulk", args, args.model, argv)
    rows: list[dict[str, Any]] = []
    with SpawnedServer(args.model, args.threads, args.max_running, 8192) as server:
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        case(server.url, [{"model": model, "prompt": "Warm-up.", "max_tokens": 2}])
        for index in range(args.trials):
            for row in trial(server.url, model, index, args):
                record.trial(**row)
                rows.append(row)
    publish_report(record, lambda: report(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
