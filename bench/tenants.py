"""Tenants: two API keys sharing a tier, fair share against FIFO admission in the same run.

`cobatch serve` in child processes with a keys file of two tenants, A and B, all up at once and
each idle while another works: `--fair-share off` (first come, first served within the tier: the
baseline), and `--fair-share on` with weights 1:1 and 3:1. Each tenant runs closed-loop clients
(the `openai` client, chat completions of exactly --tokens tokens: ignore_eos), each sending its
next request as soon as its last is answered, all in the batch tier (service_tier "flex"), then
all in the interactive tier ("priority"). Per tier and scenario, a window of --warmup + --duration
seconds on each server back to back (their order reversed on odd trials), so FIFO's window is
measured beside the fair-share ones it is the baseline of:

  backlogged  A keeps --a-in-flight requests in flight, B --b-in-flight (together more than the
              running slots): each tenant's share of the tokens generated in the window
  light       A as above, B keeps --light-in-flight: B's median request latency

A fourth server gives A a limit of --quota-in-flight requests in flight (B none), with B light:
`within` A keeps exactly its limit in flight, `hammering` A keeps --a-in-flight in flight, all but
the limit refused with 429 and retried after the wait the answer names (retry-after-ms), as the
`openai` SDK would (each client on its own; the server paces the wait to the tenant's completions,
server/retry_pacing.py), then `within again`.
B streams its answers there. B's median time to first token while A hammers, over the mean of
its medians in the two windows around it while A keeps within its limit: what refusals cost the
others (target: their TTFT unchanged within noise); B's median latency is reported the same way.
The two `within` windows bracket the hammering one, so the machine's drift over minutes cancels;
each window's ratio is shown. A window holds a few dozen of B's answers, too few for its median
to tell a 10% change from the noise, so the verdict pools every answer of B's per tier over the
trials: the median TTFT under hammering over the median within, with a 95% bootstrap interval.
Met when the interval reaches down to 1 (no increase told apart from the noise); its top is the
largest increase the run could not rule out, shown beside it. The
flood (A's clients beyond its limit) is sent over raw sockets from a process of its own at nice 19
(--no-hostile-apart: `openai` clients beside B's): a hostile client is somebody else's machine,
and on this one its CPU would be charged to the server.

Targets (issue 47), per tier: backlogged with equal weights, B's share >= 0.45 (FIFO: about
b / (a + b)); with weights 3:1, shares within 0.05 of 0.75 / 0.25; light, B's median latency
<= 0.5x its latency under FIFO; total tok/s >= 0.95 of FIFO's in both scenarios (each window's
ratio within its trial, its median over the trials). Total tok/s is the
tier's tokens, and a share each tenant's, as the server computed them over the measured part (its
counters cobatch_priority_tokens_produced_total and cobatch_tenant_tokens_produced_total, read at
both ends): answers of one length started together end together, so counting the answers that
ended in the window jumps by whole waves of them (50 s windows held 2 or 3 waves of 32 answers:
82 or 123 tok/s for the same server).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.http_targets import SpawnedServer
from bench.prompts import benchmark_prompts
from bench.record import RunRecord, add_common_arguments, run_trials
from bench.stats import median_ratio_interval
from bench.table import markdown_table

KEYS = {"a": "sk-bench-tenant-a", "b": "sk-bench-tenant-b"}
SERVICE_TIER = {"batch": "flex", "interactive": "priority"}
# (rule, --fair-share, A's weight against B's 1, scenarios run under it)
SERVERS = (("fifo", "off", 1, ("backlogged", "light")),
           ("fair 1:1", "on", 1, ("backlogged", "light")),
           ("fair 3:1", "on", 3, ("backlogged",)),
           ("quota", "on", 1, ("within", "hammering", "within again")))
QUOTA_NOISE_FLOOR = 0.02  # noise allowed however closely the two `within` windows agreed
TTFT_INTERVAL = 0.95


def keys_file(folder: Path, weight_a: float, a_in_flight_limit: int | None = None) -> Path:
    path = folder / "keys.toml"
    limit = "" if a_in_flight_limit is None else f"max_in_flight = {a_in_flight_limit}\n"
    path.write_text(f'[tenants.a]\nkeys = ["{KEYS["a"]}"]\nweight = {weight_a}\n{limit}\n'
                    f'[tenants.b]\nkeys = ["{KEYS["b"]}"]\nweight = 1\n')
    return path


def in_flight(scenario: str, args: argparse.Namespace) -> dict[str, int]:
    """Requests each tenant's clients keep in flight."""
    a = args.quota_in_flight if scenario.startswith("within") else args.a_in_flight
    b = args.b_in_flight if scenario == "backlogged" else args.light_in_flight
    return {"a": a, "b": b}


HOSTILE_NICE = 19  # the flood's own process: a client elsewhere costs this machine nothing


async def run_clients(url: str, model: str, tier: str, in_flight: dict[str, int], args: argparse.Namespace,
                      retry_s: float, start_at: float, streamed: frozenset[str] = frozenset()
                      ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Closed-loop clients from `start_at` (time.monotonic(), the same clock in every process) for
    warmup + duration seconds: every answer, timed from start_at, and each tenant's failures. A
    client whose request failed sends again after the wait a 429 names, else `retry_s` later. The
    `streamed` tenants' clients stream their answers, so their time to first token is measured."""
    import openai

    clients = {t: openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[t], max_retries=0, timeout=600)
               for t in in_flight}
    prompts = benchmark_prompts(64)
    finished: list[dict[str, Any]] = []
    failures = {t: 0 for t in in_flight}
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))

    async def client_loop(tenant: str, i: int) -> None:
        n = i
        while True:
            start = time.monotonic()
            try:
                request = dict(model=model, max_tokens=args.tokens, service_tier=SERVICE_TIER[tier],
                               messages=[{"role": "user", "content": prompts[n % len(prompts)]}],
                               temperature=0.0, extra_body={"ignore_eos": True})
                if tenant in streamed:
                    first, usage = await _streamed_answer(clients[tenant], request)
                else:
                    first, usage = None, (await clients[tenant].chat.completions.create(**request)).usage
            except Exception as exc:  # a failure is counted, not measured
                failures[tenant] += 1
                if failures[tenant] == 1:
                    print(f"{tenant}: request failed: {exc}", file=sys.stderr)
                response = getattr(exc, "response", None)
                await asyncio.sleep(_told_wait(dict(response.headers), retry_s) if response is not None
                                    and response.status_code == 429 else retry_s)
                continue
            end = time.monotonic()
            finished.append({"tenant": tenant, "start": start - start_at, "end": end - start_at,
                             "ttft": None if first is None else first - start,
                             "tokens": usage.completion_tokens if usage else 0})
            n += len(prompts) // 2 + 1

    await _loops_until_the_end(client_loop, in_flight, start_at, args)
    for client in clients.values():
        await client.close()
    return finished, failures


async def _streamed_answer(client: Any, request: dict[str, Any]) -> tuple[float | None, Any]:
    """(when the first content arrived, time.monotonic(); the usage the last chunk carries)."""
    first, usage = None, None
    stream = await client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic()
        usage = chunk.usage or usage
    return first, usage


async def _loops_until_the_end(client_loop: Any, in_flight: dict[str, int], start_at: float,
                               args: argparse.Namespace) -> None:
    """`client_loop(tenant, i)` for each of a tenant's clients, cancelled when the window ends (the
    requests still out are cancelled by the server when their clients go)."""
    tasks = [asyncio.ensure_future(client_loop(t, i)) for t, n in in_flight.items() for i in range(n)]
    await asyncio.sleep(max(0.0, start_at + args.warmup + args.duration - time.monotonic()))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def flood(url: str, model: str, tier: str, in_flight: dict[str, int], args: argparse.Namespace,
                retry_s: float, start_at: float) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """run_clients' closed loops over raw keep-alive sockets, each request's bytes built once: a
    refusal costs this side a fraction of a millisecond (the `openai` client: about 8 ms), so the
    flood keeps its rate on a machine whose cores the server fills. A refused client waits the
    response's wait (`retry_s` when it names none), as the `openai` SDK would."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    prompts = benchmark_prompts(64)
    finished: list[dict[str, Any]] = []
    failures = {t: 0 for t in in_flight}
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))

    def request_bytes(tenant: str, n: int) -> bytes:
        body = json.dumps({"model": model, "max_tokens": args.tokens, "service_tier": SERVICE_TIER[tier],
                           "messages": [{"role": "user", "content": prompts[n % len(prompts)]}],
                           "temperature": 0.0, "ignore_eos": True}).encode()
        return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEYS[tenant]}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    async def client_loop(tenant: str, i: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            request = request_bytes(tenant, i)
            while True:
                start = time.monotonic()
                writer.write(request)
                status = int((await reader.readline()).split()[1])
                headers = {}
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if status == 200:
                    finished.append({"tenant": tenant, "start": start - start_at, "end": time.monotonic() - start_at,
                                     "tokens": json.loads(body)["usage"]["completion_tokens"]})
                    continue
                failures[tenant] += 1
                await asyncio.sleep(_told_wait(headers, retry_s))
        finally:
            writer.close()

    await _loops_until_the_end(client_loop, in_flight, start_at, args)
    return finished, failures


def _told_wait(headers: dict[str, str], default_s: float) -> float:
    """The wait a 429 asks for, read as the `openai` SDK reads it: retry-after-ms first, then
    Retry-After in seconds; `default_s` when it gives neither."""
    if "retry-after-ms" in headers:
        return float(headers["retry-after-ms"]) / 1000
    return float(headers.get("retry-after", default_s))


def _hostile_process(url: str, model: str, tier: str, in_flight: dict[str, int], args: argparse.Namespace,
                     retry_s: float, start_at: float, out: Any) -> None:
    os.nice(HOSTILE_NICE)
    out.put(asyncio.run(flood(url, model, tier, in_flight, args, retry_s, start_at)))


# Engine counters read at both ends of a window, to tell where a slower window's time went.
ENGINE_COUNTERS = {"steps": "cobatch_engine_steps_total", "lane_first_tokens": "cobatch_first_token_lane_requests_total",
                   "steps_interrupted": "cobatch_engine_steps_interrupted_total",
                   "thread_switches": "cobatch_decode_thread_switches_total"}


def _read_counters(url: str, tier: str, at: tuple[float, ...], out: list[dict[str, float]]) -> None:
    """At each moment, the server's tokens produced (as computed) in `tier` and by each tenant, and
    its ENGINE_COUNTERS (under "engine")."""
    tier_pattern = re.compile(rf'^cobatch_priority_tokens_produced_total{{priority="{tier}"}} ([0-9.e+]+)$', re.M)
    tenant_pattern = re.compile(r'^cobatch_tenant_tokens_produced_total{tenant="([^"]*)"} ([0-9.e+]+)$', re.M)
    for moment in at:
        time.sleep(max(0.0, moment - time.monotonic()))
        text = httpx.get(url + "/metrics", timeout=10).text
        match = tier_pattern.search(text)
        if match is None:
            return
        engine = {}
        for name, metric in ENGINE_COUNTERS.items():
            found = re.search(rf"^{metric} ([0-9.e+]+)$", text, re.M)
            if found:
                engine[name] = float(found.group(1))
        out.append({"tier": float(match.group(1)), "engine": engine,
                    **{t: float(n) for t, n in tenant_pattern.findall(text)}})


def window(url: str, model: str, tier: str, in_flight: dict[str, int], args: argparse.Namespace,
           retry_s: float = 0.2, apart: dict[str, int] | None = None, streamed: frozenset[str] = frozenset()) -> dict:
    """What finished inside the measured part of a window. `apart` of each tenant's clients run in
    a process of their own at nice 19 (the rest in this one), so the load a flood of refused
    requests puts on the machine's cores is not charged to the server; its CPU seconds are reported."""
    import multiprocessing
    import resource

    apart = {t: n for t, n in (apart or {}).items() if n > 0}
    start_at = time.monotonic() + (3.0 if apart else 0.0)  # the other process's imports
    own = {t: n - apart.get(t, 0) for t, n in in_flight.items()}
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = None
    if apart:
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        process = context.Process(target=_hostile_process, daemon=True,
                                  args=(url, model, tier, apart, args, retry_s, start_at, out))
        process.start()
    produced: list[dict[str, float]] = []  # tokens produced, read as the measured part starts and ends
    reader = threading.Thread(target=_read_counters, daemon=True,
                              args=(url, tier, (start_at + args.warmup, start_at + args.warmup + args.duration),
                                    produced))
    reader.start()
    finished, failures = asyncio.run(run_clients(url, model, tier, own, args, retry_s, start_at, streamed))
    reader.join(30)
    hostile_cpu = 0.0
    if process is not None:
        theirs, their_failures = out.get(timeout=120)
        process.join(30)
        finished = finished + theirs
        failures = {t: failures.get(t, 0) + their_failures.get(t, 0) for t in in_flight}
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        hostile_cpu = (children.ru_utime - children_before.ru_utime) + (children.ru_stime - children_before.ru_stime)
    lo, hi = args.warmup, args.warmup + args.duration
    inside = [f for f in finished if lo <= f["end"] <= hi]
    tokens = {t: sum(f["tokens"] for f in inside if f["tenant"] == t) for t in in_flight}
    latencies = {t: [f["end"] - f["start"] for f in inside if f["tenant"] == t] for t in in_flight}
    ttfts = {t: [f["ttft"] for f in inside if f["tenant"] == t and f.get("ttft") is not None] for t in streamed}
    total = sum(tokens.values())
    # As computed: answers of 64 tokens started together end together, so the tokens of the
    # answers that ended inside the window jump by whole waves of them.
    computed = {k: produced[1].get(k, 0.0) - produced[0].get(k, 0.0) for k in ("tier", *in_flight)} \
        if len(produced) == 2 else {}
    by_tenant = sum(computed.get(t, 0.0) for t in in_flight)
    return {
        "tokens": tokens,
        "requests": {t: len(v) for t, v in latencies.items()},
        "share": {t: (computed[t] / by_tenant if by_tenant else float("nan")) for t in in_flight},
        "share_finished": {t: (n / total if total else float("nan")) for t, n in tokens.items()},
        "median_latency_s": {t: (statistics.median(v) if v else float("nan")) for t, v in latencies.items()},
        **({"median_ttft_s": {t: (statistics.median(v) if v else float("nan")) for t, v in ttfts.items()},
            "ttft_samples_s": {t: [round(x, 4) for x in v] for t, v in ttfts.items()}}
           if streamed else {}),
        "tok_s": computed["tier"] / args.duration if computed else float("nan"),
        "tok_s_finished": total / args.duration,
        "failures": failures,
        "apart_cpu_s": round(hostile_cpu, 1),
        "engine": ({k: produced[1]["engine"][k] - produced[0]["engine"].get(k, 0.0) for k in produced[1]["engine"]}
                   if len(produced) == 2 else {}),
    }


def wait_drained(url: str, timeout: float = 120.0) -> None:
    """Until no generation request is in flight (the last window's cancelled ones have ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=10).text
        match = re.search(r"^cobatch_http_generation_requests_in_flight ([0-9.e+]+)$", text, re.M)
        if match and float(match.group(1)) == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("requests still in flight after the window")


def one_trial(args: argparse.Namespace, trial: int, record: RunRecord) -> None:
    """Every chosen server up at once, each idle while another works. FIFO's and fair share's windows
    of one tier and scenario run back to back (their order reversed on odd trials), so the machine's
    drift over the minutes a trial takes falls on both sides of each tok/s ratio; the quota server's
    windows follow in each tier, bracketed by their own baseline."""
    chosen = [server for server in SERVERS if server[0] in args.rules]
    shared = [server for server in chosen if server[0] != "quota"]
    if trial % 2:
        shared.reverse()
    with tempfile.TemporaryDirectory(prefix="cobatch-bench-tenants-") as tmp, contextlib.ExitStack() as stack:
        up = {}
        for i, (rule, fair, weight_a, _) in enumerate(chosen):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            limit = args.quota_in_flight if rule == "quota" else None
            extra = ["--keys-file", str(keys_file(folder, weight_a, limit)), "--fair-share", fair]
            up[rule] = _warmed(stack.enter_context(
                SpawnedServer(args.model, args.threads, args.max_running, args.n_ctx, extra)))
        for tier in args.tiers:
            for scenario in ("backlogged", "light"):
                for rule, _, weight_a, scenarios in shared:
                    if scenario in scenarios:
                        _measured_window(up[rule], rule, weight_a, tier, scenario, args, trial, record)
            for rule, _, weight_a, scenarios in chosen:
                if rule == "quota":
                    for scenario in scenarios:
                        _measured_window(up[rule], rule, weight_a, tier, scenario, args, trial, record)


def _warmed(server: SpawnedServer) -> tuple[SpawnedServer, str]:
    """The server and its model's id, after a first request (not measured) has set up its buffers."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEYS["a"], max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    return server, model


def _measured_window(up: tuple[SpawnedServer, str], rule: str, weight_a: float, tier: str, scenario: str,
                     args: argparse.Namespace, trial: int, record: RunRecord) -> None:
    server, model = up
    wanted = in_flight(scenario, args)
    retry_s = 1.0 if scenario == "hammering" else 0.2  # when a failure names no wait
    cpu_before = _cpu_seconds(server.process.pid), time.process_time()
    beyond_limit = {"a": wanted["a"] - args.quota_in_flight} if scenario == "hammering" else None
    # B streams beside the quota so its time to first token, the measure of "unaffected", is timed.
    result = window(server.url, model, tier, wanted, args, retry_s,
                    apart=beyond_limit if args.hostile_apart else None,
                    streamed=frozenset({"b"}) if rule == "quota" else frozenset())
    # The clients run on the same cores: what they spent is the load generator's share of any
    # slowdown, not the server's.
    apart_cpu = result.pop("apart_cpu_s")
    result["cpu_s"] = {"server": round(_cpu_seconds(server.process.pid) - cpu_before[0], 1),
                       "clients": round(time.process_time() - cpu_before[1] + apart_cpu, 1),
                       "apart": apart_cpu}
    wait_drained(server.url)
    record.trial(trial=trial, rule=rule, weight_a=weight_a, tier=tier, scenario=scenario, in_flight=wanted, **result)
    print(f"trial {trial} {rule} {tier} {scenario}: B share {result['share']['b']:.3f}, "
          f"B median {result['median_latency_s']['b']:.2f} s, {result['tok_s']:.1f} tok/s, "
          f"engine {result['engine']}", file=sys.stderr)


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _baseline(record: RunRecord, t: dict) -> dict | None:
    """What a trial row is compared with: FIFO's same scenario; for the quota server's hammering,
    the mean of the two windows around it with A within its limit (a run stored before the second
    existed: the first alone); for `within again`, the first `within` (the noise)."""
    if t["rule"] != "quota":
        return _find(record, t["trial"], "fifo", t["tier"], t["scenario"])
    before = _find(record, t["trial"], "quota", t["tier"], "within")
    if t["scenario"] != "hammering":
        return before if t["scenario"] == "within again" else None
    after = _find(record, t["trial"], "quota", t["tier"], "within again")
    if before is None or after is None:
        return before or after
    return {"median_latency_s": {"b": (before["median_latency_s"]["b"] + after["median_latency_s"]["b"]) / 2},
            **({"median_ttft_s": {"b": (before["median_ttft_s"]["b"] + after["median_ttft_s"]["b"]) / 2}}
               if "median_ttft_s" in before and "median_ttft_s" in after else {}),
            "tok_s": (before["tok_s"] + after["tok_s"]) / 2,
            **({"cpu_s": {"server": (before["cpu_s"]["server"] + after["cpu_s"]["server"]) / 2}}
               if "cpu_s" in before and "cpu_s" in after else {})}


def _find(record: RunRecord, trial: int, rule: str, tier: str, scenario: str) -> dict | None:
    return next((t for t in record.trials if t["trial"] == trial and t["rule"] == rule and t["tier"] == tier
                 and t["scenario"] == scenario), None)


def report(record: RunRecord, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    rows = []
    for t in record.trials:
        fifo = _baseline(record, t)
        rows.append([t["trial"], t["tier"], t["scenario"], t["rule"], f'{t["in_flight"]["a"]}/{t["in_flight"]["b"]}',
                     f'{t["share"]["a"]:.3f}', f'{t["share"]["b"]:.3f}', t["requests"]["b"],
                     f'{t["median_latency_s"]["b"]:.2f}',
                     f'{t["median_latency_s"]["b"] / fifo["median_latency_s"]["b"]:.2f}' if fifo else "-",
                     f'{t["median_ttft_s"]["b"] * 1000:.0f}' if "median_ttft_s" in t else "-",
                     f'{t["median_ttft_s"]["b"] / fifo["median_ttft_s"]["b"]:.2f}'
                     if fifo and "median_ttft_s" in t and "median_ttft_s" in fifo else "-",
                     f'{t["tok_s"]:.1f}', f'{t["tok_s"] / fifo["tok_s"]:.3f}' if fifo and fifo["tok_s"] else "-",
                     sum(t["failures"].values()),
                     _cpu_cell(t), _engine_cell(t)])
    table = markdown_table(["trial", "tier", "scenario", "rule", "in flight A/B", "A share", "B share", "B requests",
                            "B median latency s", "B latency / baseline", "B median TTFT ms", "B TTFT / baseline",
                            "tok/s", "tok/s / baseline", "failures",
                            "CPU s: server / clients", "steps / lane first tokens / thread switches"],
                           rows)
    checks: dict[str, list[float]] = {"equal_b_share_min": [], "weighted_share_error_max": [],
                                      "light_latency_vs_fifo_max": [], "tok_s_vs_fifo_min": [], "fifo_b_share": [],
                                      "hammered_tok_s": [], "hammered_server_cpu": [],
                                      "hammered_b_latency": [], "within_latency_noise": [],
                                      "hammered_latency_within_noise": [],
                                      "hammered_b_ttft": [], "within_ttft_noise": [], "hammered_ttft_within_noise": []}
    tok_s_ratios: dict[tuple[str, str, str], list[float]] = {}  # per tier, scenario and rule: one per trial
    for t in record.trials:
        fifo = _baseline(record, t)
        if t["rule"] == "quota":
            if t["scenario"] == "hammering" and fifo:
                checks["hammered_tok_s"].append(t["tok_s"] / fifo["tok_s"])
                if "cpu_s" in t and "cpu_s" in fifo and fifo["cpu_s"]["server"]:
                    checks["hammered_server_cpu"].append(t["cpu_s"]["server"] / fifo["cpu_s"]["server"])
                again = _find(record, t["trial"], "quota", t["tier"], "within again")
                for measure, name in (("median_latency_s", "latency"), ("median_ttft_s", "ttft")):
                    if measure not in t or measure not in fifo:
                        continue  # runs stored before B streamed have no TTFT
                    checks[f"hammered_b_{name}"].append(t[measure]["b"] / fifo[measure]["b"])
                    if again is not None:
                        # Each bracketing window's distance from their mean, relative to it (about).
                        noise = abs(again[measure]["b"] / _baseline(record, again)[measure]["b"] - 1) / 2
                        checks[f"within_{name}_noise"].append(noise)
                        checks[f"hammered_{name}_within_noise"].append(
                            checks[f"hammered_b_{name}"][-1] <= 1 + noise + QUOTA_NOISE_FLOOR)
            continue
        if t["rule"] == "fifo":
            if t["scenario"] == "backlogged":
                checks["fifo_b_share"].append(t["share"]["b"])
            continue
        if fifo and fifo["tok_s"]:
            tok_s_ratios.setdefault((t["tier"], t["scenario"], t["rule"]), []).append(t["tok_s"] / fifo["tok_s"])
        if t["scenario"] == "backlogged" and t["weight_a"] == 1:
            checks["equal_b_share_min"].append(t["share"]["b"])
        elif t["scenario"] == "backlogged":
            expected_a = t["weight_a"] / (t["weight_a"] + 1)
            checks["weighted_share_error_max"].append(abs(t["share"]["a"] - expected_a))
        elif fifo:
            checks["light_latency_vs_fifo_max"].append(t["median_latency_s"]["b"] / fifo["median_latency_s"]["b"])
    # Each window's ratio is taken within a trial; a window's figure is their median over the trials.
    checks["tok_s_vs_fifo_min"] = [statistics.median(v) for v in tok_s_ratios.values()]
    pooled = _pooled_ttft(record)
    headline = {
        "equal_weights_b_share_min": round(min(checks["equal_b_share_min"], default=float("nan")), 3),
        "fifo_b_share_max": round(max(checks["fifo_b_share"], default=float("nan")), 3),
        "weights_3_1_share_error_max": round(max(checks["weighted_share_error_max"], default=float("nan")), 3),
        "light_b_latency_vs_fifo_max": round(max(checks["light_latency_vs_fifo_max"], default=float("nan")), 2),
        "tok_s_vs_fifo_min": round(min(checks["tok_s_vs_fifo_min"], default=float("nan")), 3),
        "hammered_b_latency_ratio": [round(x, 2) for x in checks["hammered_b_latency"]],
        "hammered_b_ttft_ratio": [round(x, 2) for x in checks["hammered_b_ttft"]],
        # The same as scalars (worst over tiers and trials), for `bench versions` to compare.
        "hammered_b_latency_ratio_max": round(max(checks["hammered_b_latency"], default=float("nan")), 3),
        "hammered_b_ttft_ratio_max": round(max(checks["hammered_b_ttft"], default=float("nan")), 3),
        "hammered_tok_s_ratio_min": round(min(checks["hammered_tok_s"], default=float("nan")), 3),
        "hammered_server_cpu_ratio_max": round(max(checks["hammered_server_cpu"], default=float("nan")), 3),
        # |B's measure within again / within - 1| / 2 per tier and trial: the noise its hammered ratio is
        # held to. The measure is TTFT ("their TTFT unchanged within noise"); latency is reported.
        "within_noise": [round(x, 3) for x in checks["within_latency_noise"]],
        "within_ttft_noise": [round(x, 3) for x in checks["within_ttft_noise"]],
        "hammered_within_noise": (all(checks["hammered_latency_within_noise"])
                                  if checks["hammered_latency_within_noise"] else None),
        # Runs that stored B's TTFT samples are judged on all of them (below); older ones on the brackets.
        "hammered_ttft_within_noise": (all(lo <= 1 for _, lo, _ in pooled.values()) if pooled
                                       else all(checks["hammered_ttft_within_noise"])
                                       if checks["hammered_ttft_within_noise"] else None),
        **({"hammered_b_ttft_pooled": {tier: [round(x, 3) for x in v] for tier, v in pooled.items()}}
           if pooled else {}),
    }
    met = tuple(None if math.isnan(headline[key]) else passes(headline[key]) for key, passes in (
        ("equal_weights_b_share_min", lambda x: x >= 0.45), ("weights_3_1_share_error_max", lambda x: x <= 0.05),
        ("light_b_latency_vs_fifo_max", lambda x: x <= 0.5), ("tok_s_vs_fifo_min", lambda x: x >= 0.95)))
    summary = (
        f"Tenants: two keys, closed-loop `openai` chat clients of {args.tokens}-token answers; backlogged: A keeps "
        f"{args.a_in_flight} in flight, B {args.b_in_flight}; light: B keeps {args.light_in_flight}; windows of "
        f"{args.warmup:g} s warm-up + {args.duration:g} s measured; `cobatch serve --max-running {args.max_running} "
        f"--threads {args.threads}`, `--fair-share off` (FIFO) or `on` with A's weight 1 or 3, in each tier. "
        "Shares and tok/s: tokens as computed over the measured part (the server's counters, by tenant and by "
        "tier); latencies: the answers that ended inside it.\n\n"
        f"{table}\n\nTargets, worst over tiers and trials: equal weights, B's share >= 0.45: "
        f"{_verdict(met[0])} ({headline['equal_weights_b_share_min']}; FIFO {headline['fifo_b_share_max']}); "
        f"weights 3:1, shares within 0.05 of 0.75 / 0.25: {_verdict(met[1])} "
        f"(off by {headline['weights_3_1_share_error_max']}); light tenant's median latency <= 0.5x FIFO's: "
        f"{_verdict(met[2])} ({headline['light_b_latency_vs_fifo_max']}x); total tok/s >= 0.95 of FIFO's (each "
        f"window's ratio to FIFO's beside it, its median over the trials, the worst window): "
        f"{_verdict(met[3])} ({headline['tok_s_vs_fifo_min']}).\n\n"
        + (_quota_paragraph(args, headline) if "quota" in args.rules else "Quota: not run.")
    )
    return summary, headline


def _quota_paragraph(args: argparse.Namespace, headline: dict[str, Any]) -> str:
    pooled = headline.get("hammered_b_ttft_pooled", {})
    return (
        f"Quota: A limited to {args.quota_in_flight} in flight; B (streaming) while A keeps "
        f"{args.a_in_flight} clients sending (all but {args.quota_in_flight} refused with 429) against B while A "
        f"keeps within its limit (the mean of the windows before and after), per tier and trial. B's median time "
        f"to first token: {headline['hammered_b_ttft_ratio']}, the noise (each `within` window's distance from "
        f"that mean) {headline['within_ttft_noise']}"
        + (f". Every TTFT of B's, pooled over trials, hammering against within, per tier: "
           + "; ".join(f"{tier} {r:.3f} ({TTFT_INTERVAL:.0%} interval {lo:.3f}-{hi:.3f})"
                       for tier, (r, lo, hi) in pooled.items())
           + f"; unchanged within noise (the interval reaches down to 1: an increase not told apart from the "
             f"noise; its top is the largest increase the run could not rule out): "
           if pooled else f", unchanged within noise (ratio <= 1 + noise + {QUOTA_NOISE_FLOOR:g}): ")
        + f"{_verdict(headline['hammered_ttft_within_noise'])}. B's median latency: "
        f"{headline['hammered_b_latency_ratio']}, noise {headline['within_noise']}, within it: "
        f"{_verdict(headline['hammered_within_noise'])} (the baseline column: FIFO's for the fair-share rows; "
        "for `hammering`, the mean of the two `within` windows; for `within again`, the first). The clients "
        f"run on the same cores as the server: the last column is what each spent over the window's "
        f"{args.warmup + args.duration:g} s, so a slowdown under hammering splits into the refusals' cost to the "
        "server and the load generator's to the machine. "
        + (f"Under hammering, A's clients beyond its limit send over raw sockets from a process of their own at "
           f"nice {HOSTILE_NICE} (in brackets: its CPU seconds), as a client on another machine would cost this "
           "one nothing; `failures` counts their 429s."
           if args.hostile_apart else "All clients run in one process at normal priority.")
    )


def _pooled_ttft(record: RunRecord) -> dict[str, tuple[float, float, float]]:
    """Per tier, B's median TTFT over every hammering window's answers against every `within`
    window's, pooled over trials (a window holds a few dozen answers: too few for its median to tell
    a change from the noise), with its bootstrap interval. Empty for runs that stored no samples."""
    found: dict[str, dict[str, list[float]]] = {}
    for t in record.trials:
        if t["rule"] != "quota" or "ttft_samples_s" not in t:
            continue
        side = "hammering" if t["scenario"] == "hammering" else "within"
        found.setdefault(t["tier"], {"hammering": [], "within": []})[side] += t["ttft_samples_s"]["b"]
    return {tier: median_ratio_interval(s["hammering"], s["within"], TTFT_INTERVAL) for tier, s in found.items()
            if s["hammering"] and s["within"]}


def _cpu_cell(t: dict) -> str:
    if "cpu_s" not in t:
        return "-"
    cpu = t["cpu_s"]
    apart = f' ({cpu["apart"]} at nice {HOSTILE_NICE})' if cpu.get("apart") else ""
    return f'{cpu["server"]} / {cpu["clients"]}{apart}'


def _engine_cell(t: dict) -> str:
    engine = t.get("engine") or {}
    if not engine:
        return "-"
    return " / ".join(f'{engine[k]:.0f}' if k in engine else "-" for k in ("steps", "lane_first_tokens", "thread_switches"))


def _verdict(ok: bool | None) -> str:
    return "not run" if ok is None else "met" if ok else "missed"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cobatch bench tenants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, trials=2)
    parser.add_argument("--tokens", type=int, default=64, help="tokens of every answer")
    parser.add_argument("--a-in-flight", type=int, default=96)
    parser.add_argument("--b-in-flight", type=int, default=24)
    parser.add_argument("--light-in-flight", type=int, default=2)
    parser.add_argument("--quota-in-flight", type=int, default=4, help="A's max_in_flight on the quota server")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before a window's measured part")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds of each window")
    parser.add_argument("--tiers", nargs="+", choices=list(SERVICE_TIER), default=list(SERVICE_TIER))
    parser.add_argument("--rules", nargs="+", choices=[s[0] for s in SERVERS], default=[s[0] for s in SERVERS],
                        help="the servers to run (a target without its baseline's server is not judged)")
    parser.add_argument("--hostile-apart", action=argparse.BooleanOptionalAction, default=True,
                        help="under hammering, run A's clients beyond its limit in their own process at nice 19")
    parser.add_argument("--max-running", "--max-batch", type=int, default=32)
    parser.add_argument("--n-ctx", type=int, default=8192)
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.a_in_flight, args.b_in_flight, args.light_in_flight, args.quota_in_flight = 8, 8, 4, 1, 2
        args.warmup, args.duration, args.max_running, args.n_ctx, args.trials = 0.5, 2.5, 4, 2048, 1
    run_trials("tenants", args, argv, one_trial, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
