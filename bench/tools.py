"""Tool calling: valid calls per tool_choice, calls-grammar compile time, tool turns' speed.

Over N tool sets (bench/tool_sets.py: 1 to 4 functions with real-world-shaped parameters) and
`tool_choice` required, named (a function drawn per set) and auto, each with every seed, the
same chat requests go to `cobatch serve` (a child process) and, when given, to a llama-server
started with --jinja (`--peer-bin`) or already running (`--peer-url`). An answer counts as
complete and valid when: required / named, it carries calls (finish_reason "tool_calls"), each
naming a function it may call, with arguments that parse and validate against that function's
parameters (jsonschema, with format checks); auto, the same, or text without calls (and never an
empty tool_calls list). Requests that got no answer (an HTTP error) are counted apart.

Compile time: each set's calls grammar (the schema server/tools.py builds, compiled for the
model's vocabulary in this process, the server idle), first use (nothing cached; the one-time
vocabulary index is built before and reported apart) and reuse (the grammar cache).

Speed: for the first sets, a tool-call turn (required) and a JSON-schema turn of the same
length, one after the other, in turn order alternating: the same messages and tools, the second
with tool_choice "none" and response_format json_schema set to the very calls schema, greedy,
so both generate the same tokens (unless a near tie in the logits goes the other way between
two computations of the same prompt: the table counts the pairs of equal length). tok/s is the server's own per-request figure (generated
tokens over time from admission), and the ratio is taken per pair, then its median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema

from bench.peer import add_peer_arguments, llama_server, peer_binary
from bench.record import RunRecord, add_common_arguments, publish
from bench.stats import percentile
from bench.table import markdown_table
from bench.tool_sets import tool_sets

MODES = ("required", "named", "auto")


def requests_for(sets: list[dict[str, Any]], seeds: list[int], max_tokens: int, temperature: float) -> list[dict]:
    out = []
    for i, s in enumerate(sets):
        named = s["tools"][i % len(s["tools"])]["function"]["name"]
        for mode in MODES:
            choice: Any = {"type": "function", "function": {"name": named}} if mode == "named" else mode
            for seed in seeds:
                out.append({"set": i, "mode": mode, "seed": seed, "body": {
                    "messages": [{"role": "user", "content": s["prompt"]}], "tools": s["tools"],
                    "tool_choice": choice, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}})
    return out


def judge(request: dict, status: int, payload: dict | None) -> dict:
    """{"answered", "valid", "called", "why"} for one answer."""
    if status != 200 or payload is None:
        return {"answered": False, "valid": False, "called": False, "why": f"HTTP {status}"}
    choice = payload["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls")
    body = request["body"]
    declared = {t["function"]["name"]: t["function"].get("parameters") or {} for t in body["tools"]}
    allowed = ([body["tool_choice"]["function"]["name"]] if isinstance(body["tool_choice"], dict)
               else list(declared))
    if calls is None or (not calls and request["mode"] == "auto"):
        if calls == []:
            return {"answered": True, "valid": False, "called": False, "why": "empty tool_calls"}
        ok = request["mode"] == "auto" and isinstance(message.get("content"), str)
        return {"answered": True, "valid": ok, "called": False,
                "why": "" if ok else f"no calls (finish_reason {choice.get('finish_reason')})"}
    if not calls or choice.get("finish_reason") != "tool_calls":
        return {"answered": True, "valid": False, "called": True, "why": f"finish_reason {choice.get('finish_reason')}"}
    for call in calls:
        name = (call.get("function") or {}).get("name")
        if name not in allowed:
            return {"answered": True, "valid": False, "called": True, "why": f"called {name!r}"}
        try:
            arguments = json.loads(call["function"].get("arguments", ""))
            jsonschema.validate(arguments, declared[name], format_checker=jsonschema.FormatChecker())
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            return {"answered": True, "valid": False, "called": True, "why": f"{type(exc).__name__}: {str(exc)[:80]}"}
    return {"answered": True, "valid": True, "called": True, "why": ""}


def send_all(url: str, model: str, requests: list[dict], concurrency: int) -> list[dict]:
    def one(request: dict) -> dict:
        start = time.perf_counter()
        with httpx.Client(base_url=url, timeout=600) as client:
            r = client.post("/v1/chat/completions", json={"model": model, **request["body"]})
        try:
            payload = r.json() if r.status_code == 200 else None
        except json.JSONDecodeError:
            payload = None
        verdict = judge(request, r.status_code, payload)
        usage = (payload or {}).get("usage") or {}
        return {"set": request["set"], "mode": request["mode"], "seed": request["seed"], **verdict,
                "tokens": usage.get("completion_tokens"), "ms": round((time.perf_counter() - start) * 1000, 1)}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, requests))


def validity_rows(label: str, outcomes: list[dict]) -> list[list[object]]:
    rows = []
    for mode in MODES:
        mine = [o for o in outcomes if o["mode"] == mode]
        answered = [o for o in mine if o["answered"]]
        valid = sum(o["valid"] for o in answered)
        rows.append([label, mode, len(mine), len(answered), f"{100 * valid / max(1, len(answered)):.1f}%",
                     f"{100 * sum(o['called'] for o in answered) / max(1, len(answered)):.0f}%",
                     "; ".join(sorted({o["why"] for o in mine if not o["valid"]}))[:120] or "-"])
    return rows


def compile_times(sets: list[dict[str, Any]], model_path: str) -> dict[str, list[float]]:
    """ms per calls grammar, first use and reuse, for every set's required and named schemas."""
    from bindings import Model
    from sampling.grammar import compile_grammar
    from sampling.grammar.vocab_index import index_for
    from sampling.vocabulary import TokenVocabulary
    from server.tools import parse_tools

    with Model(model_path) as model:
        vocab = TokenVocabulary(model.token_bytes, model.eog_tokens, model.special_tokens)
    start = time.perf_counter()
    index_for(vocab)
    out: dict[str, list[float]] = {"vocab_index": [(time.perf_counter() - start) * 1000], "first": [], "reuse": []}
    # The process's first compile also fills process-wide tables (a server pays it once, at its first
    # JSON request): timed apart, on a small function of its own that none of the sets uses.
    warm = parse_tools([{"type": "function", "function": {"name": "warm_up", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}}}], "required", None)
    start = time.perf_counter()
    compile_grammar(warm.calls_schema(), vocab)
    out["warm_up"] = [(time.perf_counter() - start) * 1000]
    for i, s in enumerate(sets):
        named = {"type": "function", "function": {"name": s["tools"][i % len(s["tools"])]["function"]["name"]}}
        for choice in ("required", named):  # auto compiles the same schema as required
            schema = parse_tools(s["tools"], choice, None).calls_schema()
            for key in ("first", "reuse"):
                start = time.perf_counter()
                compile_grammar(schema, vocab)
                out[key].append((time.perf_counter() - start) * 1000)
    return out


def speed_pairs(url: str, model: str, sets: list[dict[str, Any]], pairs: int, max_tokens: int) -> list[dict]:
    from server.tools import parse_tools

    out = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for i, s in enumerate(sets[:pairs]):
            base = {"model": model, "messages": [{"role": "user", "content": s["prompt"]}], "tools": s["tools"],
                    "max_tokens": max_tokens, "temperature": 0.0, "seed": 100 + i}
            schema = parse_tools(s["tools"], "required", None).calls_schema()
            turns = {"tool": {**base, "tool_choice": "required"},
                     "json": {**base, "tool_choice": "none",
                              "response_format": {"type": "json_schema", "json_schema": {"name": "calls", "schema": schema}}}}
            client.post("/v1/chat/completions", json=turns["tool"])  # warm: grammar compiled, prompt cached
            measured = {}
            for kind in (("tool", "json") if i % 2 == 0 else ("json", "tool")):
                metrics = client.post("/v1/chat/completions", json=turns[kind]).json()["metrics"]
                measured[kind] = metrics
            out.append({"set": i, "tool_tok_s": measured["tool"]["tokens_per_second"],
                        "json_tok_s": measured["json"]["tokens_per_second"],
                        "tool_tokens": measured["tool"]["tokens_generated"],
                        "json_tokens": measured["json"]["tokens_generated"],
                        "ratio": measured["tool"]["tokens_per_second"] / max(1e-9, measured["json"]["tokens_per_second"])})
    return out


def run(args: argparse.Namespace, record: RunRecord) -> tuple[str, dict]:
    from bench.http_targets import SpawnedServer
    from engine.model_source import resolve_model

    model_path = str(resolve_model(args.model))
    sets = tool_sets(args.sets, args.seed)
    seeds = list(range(args.seeds))
    requests = requests_for(sets, seeds, args.max_tokens, args.temperature)
    compiles = compile_times(sets, model_path)
    with SpawnedServer(args.model, args.threads, args.concurrency, args.n_ctx) as server:
        model_id = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        started = time.perf_counter()
        ours = send_all(server.url, model_id, requests, args.concurrency)
        wall = time.perf_counter() - started
        speeds = speed_pairs(server.url, model_id, sets, args.speed_pairs, args.max_tokens)
    for o in ours:
        record.trial(server="cobatch", **o)
    for p in speeds:
        record.trial(kind="speed", **p)
    record.trial(kind="compile_ms", **{k: [round(v, 2) for v in vs] for k, vs in compiles.items()})
    rows = validity_rows("cobatch", ours)
    peer_note = "no peer (give --peer-bin or --peer-url for llama-server --jinja on the same requests)"
    binary = peer_binary(args)
    if args.peer_url or binary:
        if args.peer_url:
            theirs = send_all(args.peer_url, model_id, requests, args.concurrency)
            peer_note = f"peer: llama-server at {args.peer_url}"
        else:
            with llama_server(binary, model_path, args.threads, args.concurrency, args.n_ctx,
                              extra_args=["--jinja"]) as url:
                theirs = send_all(url, model_id, requests, args.concurrency)
            peer_note = f"peer: {binary} --jinja, started for this run"
        for o in theirs:
            record.trial(server="llama-server", **o)
        rows += validity_rows("llama-server --jinja", theirs)
    answered = [o for o in ours if o["answered"]]
    valid_share = sum(o["valid"] for o in answered) / max(1, len(answered))
    first, reuse = compiles["first"], compiles["reuse"]
    ratios = [p["ratio"] for p in speeds]
    same_length = sum(p["tool_tokens"] == p["json_tokens"] for p in speeds)
    table = markdown_table(["server", "tool_choice", "requests", "answered", "complete and valid", "called",
                            "why not valid"], rows)
    compile_table = markdown_table(
        ["calls grammar compile", "grammars", "p50 ms", "p95 ms", "max ms"],
        [["first use", len(first), percentile(first, 50), percentile(first, 95), max(first)],
         ["reuse (grammar cache)", len(reuse), percentile(reuse, 50), percentile(reuse, 95), max(reuse)]])
    speed_table = markdown_table(
        ["turns", "pairs", "same length", "tokens per turn (median)", "tool turn tok/s (median)", "JSON-schema turn tok/s (median)",
         "ratio tool / JSON (median of pairs)"],
        [["tool call vs json_schema", len(speeds), same_length,
          statistics.median(p["tool_tokens"] for p in speeds) if speeds else "-",
          statistics.median(p["tool_tok_s"] for p in speeds) if speeds else "-",
          statistics.median(p["json_tok_s"] for p in speeds) if speeds else "-",
          statistics.median(ratios) if ratios else "-"]])
    summary = (f"{len(sets)} tool sets x {len(MODES)} tool_choice modes x {len(seeds)} seed(s) = {len(requests)} "
               f"requests, temperature {args.temperature}, max_tokens {args.max_tokens}, {args.concurrency} in flight "
               f"({wall:.0f} s for cobatch's). {peer_note}.\n\n{table}\n\n"
               f"Calls-grammar compile for the model's vocabulary, in this process, the server idle (before "
               f"them, once per process and not counted: the vocabulary index, {compiles['vocab_index'][0]:.0f} ms, "
               f"and a first compile of a two-member function none of the sets uses, "
               f"{compiles['warm_up'][0]:.0f} ms):\n\n{compile_table}\n\n"
               f"Speed, the same tokens generated both ways:\n\n{speed_table}")
    headline = {"valid_pct": round(100 * valid_share, 2), "answered": len(answered), "requests": len(ours),
                "compile_first_p95_ms": round(percentile(first, 95), 2),
                "compile_reuse_p95_ms": round(percentile(reuse, 95), 3),
                "tool_vs_json_tok_s": round(statistics.median(ratios), 3) if ratios else None}
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench tools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", type=int, default=40, help="tool sets")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per set and tool_choice")
    parser.add_argument("--seed", type=int, default=0, help="which tool sets are drawn")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--n-ctx", type=int, default=8192, help="KV cells of each server (shared by its requests)")
    parser.add_argument("--speed-pairs", type=int, default=20, help="tool / JSON-schema turn pairs")
    add_peer_arguments(parser)  # the peer is started with --jinja
    parser.add_argument("--peer-url", default=None, help="a llama-server already running (with --jinja)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.sets, args.seeds, args.max_tokens, args.speed_pairs, args.concurrency = 2, 1, 96, 1, 2
    record = RunRecord("tools", args, args.model, argv)
    publish(record, *run(args, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
