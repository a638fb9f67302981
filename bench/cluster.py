"""Cluster routing: a multi-tenant chat workload on 2 engine replicas (Ray Serve), routed by
Ray's prefix-cache affinity router against its round-robin and power-of-two routers, same run.

8 tenants, each with its own system prompt of ~500 tokens; 4 users per tenant; 6 turns per
user, each resending the whole conversation; 8 conversations in flight, from 8 different tenants
at a time; temperature 0; each replica's n_ctx (4096) too small to keep every tenant's prefix.
Every (trial, router) gets freshly started replicas (cold caches), in interleaved order.

Measured: prefix-cache token hit rate (the replicas' engines' sum of cached_tokens over sum of
prompt_tokens, from their own counters), TTFT p50/p90 as the client sees it (request sent to
first streamed content), generated tok/s over the trial's wall time, each replica's share of
requests. Targets (issue 17): hit rate >= 20 points above round-robin, TTFT p50 >= 30% lower,
no replica above 65% of requests.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import time
from typing import Any

import httpx

from bench.record import RunRecord, add_record_arguments, publish
from bench.stats import percentile
from bench.table import markdown_table

POLICIES = ("prefix", "round-robin", "power-of-two")
COMPANIES = ["Harbor Bank", "Pine Clinic", "Atlas Freight", "Nimbus Cloud", "Quill Books", "Vela Air",
             "Orchard Foods", "Summit Gear", "Coral Hotels", "Ember Energy", "Lumen Labs", "Tidal Telecom"]
TOPICS = ["refunds", "delivery times", "opening hours", "account security", "prices", "warranties",
          "complaints", "loyalty points", "data privacy", "cancellations", "gift cards", "accessibility"]


def system_prompt(model: Any, tenant: int, n_tokens: int) -> str:
    """About n_tokens of tenant-specific policy text (cut on a token boundary)."""
    company = COMPANIES[tenant % len(COMPANIES)]
    rules = [f"You are the customer assistant of {company} (tenant {tenant})."]
    for i in range(200):
        topic = TOPICS[(i * 5 + tenant) % len(TOPICS)]
        rules.append(f"Policy {tenant}.{i}: about {topic}, {company} answers within {i % 9 + 1} days "
                     f"and never promises more than rule {i * 3 % 17} allows.")
    ids = model.tokenize(" ".join(rules), add_bos=False)
    if len(ids) < n_tokens:
        raise ValueError("system prompt text too short")
    return b"".join(model.token_bytes[t] for t in ids[:n_tokens]).decode("utf-8", "ignore")


def conversations(model: Any, tenants: int, users: int, system_tokens: int) -> list[dict]:
    """User-major order: consecutive conversations (and so the ones in flight together) belong
    to different tenants."""
    systems = [system_prompt(model, t, system_tokens) for t in range(tenants)]
    return [{"tenant": t, "user": u, "messages": [{"role": "system", "content": systems[t]}]}
            for u in range(users) for t in range(tenants)]


async def chat_turn(client: httpx.AsyncClient, model: str, messages: list[dict], max_tokens: int) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft, text, usage = None, [], None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:"):])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    ttft = ttft if ttft is not None else time.perf_counter() - sent
                    text.append(content)
    if usage is None:
        raise RuntimeError("the stream carried no usage chunk")
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - sent, "text": "".join(text),
            "completion_tokens": usage["completion_tokens"]}


async def run_workload(url: str, model: str, convs: list[dict], turns: int, in_flight: int, max_tokens: int) -> dict:
    queue: asyncio.Queue = asyncio.Queue()
    for conv in convs:
        queue.put_nowait({**conv, "messages": list(conv["messages"])})
    turns_done: list[dict] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            conv = queue.get_nowait()
            for k in range(turns):
                question = f"(user {conv['user']}) Question {k + 1}: what is your policy on {TOPICS[(k + conv['user']) % len(TOPICS)]}?"
                conv["messages"].append({"role": "user", "content": question})
                turn = await chat_turn(client, model, conv["messages"], max_tokens)
                conv["messages"].append({"role": "assistant", "content": turn["text"] or "(no answer)"})
                turns_done.append(turn)

    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0)) as client:
        await asyncio.gather(*(worker(client) for _ in range(in_flight)))
    wall = time.perf_counter() - start
    return {"turns": turns_done, "wall_s": wall}


def run_trial(args: argparse.Namespace, policy: str, trial: int, convs: list[dict], engine_options: dict) -> dict:
    from ray import serve

    from server.cluster.deploy import ENGINE_DEPLOYMENT, build_application, remove_app

    app_name = f"bench-{policy}-{trial}"
    url = f"http://127.0.0.1:{args.port}/{app_name}"
    serve.run(build_application(args.model, engine_options, replicas=args.replicas, routing=policy,
                                imbalanced_threshold=args.imbalanced_threshold, replica_cpus=args.replica_cpus,
                                drain_timeout=5.0),
              name=app_name, route_prefix=f"/{app_name}")
    try:
        deadline = time.monotonic() + 300
        while httpx.get(f"{url}/health", timeout=30).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{app_name} did not become healthy")
            time.sleep(0.5)
        engines = serve.get_deployment_handle(ENGINE_DEPLOYMENT, app_name=app_name)
        before = {s.replica: s.counters for s in engines.broadcast("stats").results(timeout_s=60)}
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        run = asyncio.run(run_workload(url, model, convs, args.turns, args.in_flight, args.max_tokens))
        after = {s.replica: s.counters for s in engines.broadcast("stats").results(timeout_s=60)}
    finally:
        remove_app(app_name)
    if set(after) != set(before):
        raise RuntimeError(f"replicas changed during the trial: {sorted(before)} -> {sorted(after)}")
    gained = {r: {f: getattr(after[r], f) - getattr(before[r], f) for f in ("finished", "prompt_tokens", "cached_tokens")}
              for r in after}
    ttfts = [t["ttft_s"] * 1000 for t in run["turns"]]
    generated = sum(t["completion_tokens"] for t in run["turns"])
    prompt = sum(g["prompt_tokens"] for g in gained.values())
    cached = sum(g["cached_tokens"] for g in gained.values())
    return {
        "routing": policy, "trial": trial, "requests": len(run["turns"]),
        "replica_requests": {r: g["finished"] for r, g in gained.items()},
        "prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_ms": ttfts, "ttft_p50_ms": percentile(ttfts, 50), "ttft_p90_ms": percentile(ttfts, 90),
        "generated_tokens": generated, "wall_s": run["wall_s"], "tok_s": generated / run["wall_s"],
        "max_share": max(g["finished"] for g in gained.values()) / max(1, len(run["turns"])),
    }


def render(trials: list[dict], args: argparse.Namespace) -> tuple[str, dict]:
    rows = [[t["routing"], t["trial"], t["requests"], f"{100 * t['hit_rate']:.1f}", round(t["ttft_p50_ms"]),
             round(t["ttft_p90_ms"]), f"{t['tok_s']:.1f}",
             " / ".join(f"{100 * n / max(1, t['requests']):.0f}%" for n in sorted(t["replica_requests"].values(), reverse=True))]
            for t in trials]
    table = markdown_table(["routing", "trial", "requests", "hit rate %", "TTFT p50 ms", "TTFT p90 ms", "tok/s",
                            "replica shares"], rows)

    def median(policy: str, key: str) -> float:
        return statistics.median(t[key] for t in trials if t["routing"] == policy)

    summary_rows, headline = [], {}
    for policy in POLICIES:
        summary_rows.append([policy, f"{100 * median(policy, 'hit_rate'):.1f}", round(median(policy, "ttft_p50_ms")),
                             round(median(policy, "ttft_p90_ms")), f"{median(policy, 'tok_s'):.1f}",
                             f"{100 * max(t['max_share'] for t in trials if t['routing'] == policy):.0f}%"])
    hit_gain = 100 * (median("prefix", "hit_rate") - median("round-robin", "hit_rate"))
    ttft_cut = 1 - median("prefix", "ttft_p50_ms") / median("round-robin", "ttft_p50_ms")
    max_share = max(t["max_share"] for t in trials if t["routing"] == "prefix")
    verdict = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    targets = markdown_table(["target (prefix vs round-robin, medians over trials)", "measured", "verdict"], [
        ["hit rate >= 20 points higher", f"{hit_gain:+.1f} points", verdict(hit_gain >= 20)],
        ["TTFT p50 >= 30% lower", f"{100 * ttft_cut:.0f}% lower", verdict(ttft_cut >= 0.30)],
        ["no replica above 65% of requests", f"max {100 * max_share:.0f}%", verdict(max_share <= 0.65)],
    ])
    summary = markdown_table(["routing (median of trials)", "hit rate %", "TTFT p50 ms", "TTFT p90 ms", "tok/s",
                              "max replica share"], summary_rows)
    settings = (f"{args.replicas} replicas x {args.threads or 'cores/replicas'} threads, n_ctx {args.n_ctx} each "
                f"(idle prefix cache up to {args.cache_max_fraction:.0%} of it); "
                f"{args.tenants} tenants x {args.users} users x {args.turns} turns, system prompts {args.system_tokens} "
                f"tokens, {args.in_flight} in flight, max_tokens {args.max_tokens}, temperature 0; "
                f"imbalanced_threshold {args.imbalanced_threshold}; {os.cpu_count()} logical cores")
    headline = {"hit_gain_points": round(hit_gain, 1), "ttft_p50_cut": round(ttft_cut, 3),
                "prefix_max_share": round(max_share, 3),
                "prefix_hit_rate": round(median("prefix", "hit_rate"), 3),
                "rr_hit_rate": round(median("round-robin", "hit_rate"), 3)}
    return f"{settings}\n\n{table}\n\n{summary}\n\n{targets}", headline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="per replica (default: cores / replicas)")
    parser.add_argument("--n-ctx", type=int, default=4096, help="KV cells per replica")
    parser.add_argument("--cache-max-fraction", type=float, default=0.5,
                        help="share of a replica's KV cells idle cached prefixes may keep (default 0.5: about "
                             "4 of the 8 system prompts per replica)")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-tokens", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--imbalanced-threshold", type=float, default=4)
    parser.add_argument("--replica-cpus", type=float, default=1.0, help="Ray logical CPUs per replica")
    parser.add_argument("--port", type=int, default=None,
                        help="Serve's HTTP port (when Ray Serve already runs in this process: its port)")
    parser.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting one")
    parser.add_argument("--model", default=None, help="GGUF path (default: the bundled model)")
    parser.add_argument("--quick", action="store_true", help="tiny settings, for tests")
    add_record_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.n_ctx, args.tenants, args.users, args.turns = 1, 1024, 2, 2, 2
        args.system_tokens, args.in_flight, args.max_tokens = 64, 2, 4
    args.port = args.port or _free_port()

    import ray
    from ray import serve

    from bindings import Model
    from engine.model_source import resolve_model
    from server.cluster.deploy import init_ray

    record = RunRecord("cluster", args, args.model, argv)
    started_ray = not ray.is_initialized()
    init_ray(args.ray_address, args.replicas, args.replica_cpus)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    engine_options = dict(n_ctx=args.n_ctx, n_threads=args.threads, max_running=16, step_token_budget=256,
                          flash_attn=True,  # as `cobatch serve` runs by default
                          cache_max_fraction=args.cache_max_fraction)
    with Model(resolve_model(args.model)) as model:
        convs = conversations(model, args.tenants, args.users, args.system_tokens)
    try:
        for trial in range(1, args.trials + 1):
            for policy in POLICIES:
                result = run_trial(args, policy, trial, convs, engine_options)
                record.trial(**result)
                print(f"trial {trial} {policy}: hit rate {100 * result['hit_rate']:.1f}%, "
                      f"TTFT p50 {result['ttft_p50_ms']:.0f} ms, {result['tok_s']:.1f} tok/s, "
                      f"shares {sorted(result['replica_requests'].values(), reverse=True)}", flush=True)
    finally:
        if started_ray:
            serve.shutdown()
            ray.shutdown()
    publish(record, *render(record.trials, args))
    return 0
