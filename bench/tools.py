"""Tool calling: valid calls per tool_choice, calls-grammar compile time, tool turns' speed.

Over N tool sets (bench/tool_sets.py: 1 to 4 functions with real-world-shaped parameters) and
`tool_choice` required, named (a function drawn per set) and auto, each with every seed, the
same requests go, through each route of `--routes` (chat completions, Responses, Messages: the
same conversation in each dialect, bench/tool_routes.py), to `cobatch serve` (a child process)
and, when given, to a llama-server started with --jinja (`--peer-bin`) or already running
(`--peer-url`); a route the llama-server build does not serve (404) is reported as such. An
answer counts as complete and valid when: required / named, it carries calls and the dialect
says it ended with them (finish_reason "tool_calls", status "completed", stop_reason
"tool_use"), each naming a function it may call, with arguments that parse and validate against
that function's parameters (jsonschema, with format checks); auto, the same, or text without
calls (and never an empty tool_calls list). Requests that got no answer (an HTTP error, a body
not in the dialect's shape) are counted apart.

Compile time: each set's calls grammar (the schema server/tools.py builds, compiled for the
model's vocabulary in this process, the server idle), first use (nothing cached; the one-time
vocabulary index is built before and reported apart) and reuse (the grammar cache).

Speed: for the first sets, a tool-call turn (required) and a JSON-schema turn of the same
length, one after the other, in turn order alternating: the same messages and tools, the second
with tool_choice "none" and response_format json_schema set to the very calls schema, greedy,
so both generate the same tokens (unless a near tie in the logits goes the other way between
two computations of the same prompt: the table counts the pairs of equal length). tok/s is the
server's own per-request figure (generated tokens over time from admission), and the ratio is
taken per pair, then its median (chat route only).
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
from bench.tool_routes import ROUTES, Answer, Route
from bench.tiny_families import TINY_FAMILIES
from bench.tiny_model import tiny_model_path
from bench.tool_sets import tool_sets

MODES = ("required", "named", "auto")
FORCED = ("required", "named")  # the modes whose every answer must be calls


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


def judge(request: dict, status: int, answer: Answer | None) -> dict:
    """{"answered", "valid", "called", "why"} for one answer, read from any route (bench/tool_routes.py)."""
    if status != 200 or answer is None:
        why = f"HTTP {status}" if status != 200 else "no answer in the route's shape"
        return {"answered": False, "valid": False, "called": False, "why": why}
    calls = answer.calls
    body = request["body"]
    declared = {t["function"]["name"]: t["function"].get("parameters") or {} for t in body["tools"]}
    allowed = ([body["tool_choice"]["function"]["name"]] if isinstance(body["tool_choice"], dict)
               else list(declared))
    if calls is None or (not calls and request["mode"] == "auto"):
        if calls == []:
            return {"answered": True, "valid": False, "called": False, "why": "empty tool_calls"}
        ok = request["mode"] == "auto" and isinstance(answer.text, str)
        return {"answered": True, "valid": ok, "called": False, "why": "" if ok else f"no calls ({answer.finish})"}
    if not calls or not answer.ended_with_calls:
        return {"answered": True, "valid": False, "called": True, "why": f"calls, but {answer.finish}"}
    for name, arguments in calls:
        if name not in allowed:
            return {"answered": True, "valid": False, "called": True, "why": f"called {name!r}"}
        try:
            value = json.loads(arguments) if isinstance(arguments, str) else arguments
            jsonschema.validate(value, declared[name], format_checker=jsonschema.FormatChecker())
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            return {"answered": True, "valid": False, "called": True, "why": f"{type(exc).__name__}: {str(exc)[:80]}"}
    return {"answered": True, "valid": True, "called": True, "why": ""}


def send_all(url: str, model: str, requests: list[dict], concurrency: int, route: Route = ROUTES["chat"]) -> list[dict]:
    """Every request through `route`, judged; each outcome says which route it took."""
    def one(request: dict) -> dict:
        start = time.perf_counter()
        with httpx.Client(base_url=url, timeout=600) as client:
            r = client.post(route.path, json=route.body(request["body"], model))
        try:
            payload = r.json() if r.status_code == 200 else None
            answer = None if payload is None else route.read(payload)
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            payload, answer = None, None  # not the dialect's answer shape: counted as not answered
        verdict = judge(request, r.status_code, answer)
        usage = (payload or {}).get("usage") or {}
        return {"route": route.name, "set": request["set"], "mode": request["mode"], "seed": request["seed"],
                **verdict, "tokens": usage.get("completion_tokens", usage.get("output_tokens")),
                "ms": round((time.perf_counter() - start) * 1000, 1)}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, requests))


def route_served(url: str, route: Route) -> bool:
    """Whether a server has the route at all (a build without it answers 404)."""
    return httpx.post(f"{url}{route.path}", json={}, timeout=60).status_code != 404


def validity_rows(label: str, route: str, outcomes: list[dict]) -> list[list[object]]:
    rows = []
    for mode in MODES:
        mine = [o for o in outcomes if o["mode"] == mode]
        answered = [o for o in mine if o["answered"]]
        valid = sum(o["valid"] for o in answered)
        rows.append([label, ROUTES[route].path, mode, len(mine), len(answered),
                     f"{100 * valid / max(1, len(answered)):.1f}%",
                     f"{100 * sum(o['called'] for o in answered) / max(1, len(answered)):.0f}%",
                     "; ".join(sorted({o["why"] for o in mine if not o["valid"]}))[:120] or "-"])
    return rows


def compile_times(sets: list[dict[str, Any]], model_path: str) -> tuple[dict[str, list[float]], Any]:
    """ms per calls grammar, first use and reuse, for every set's required and named calls, in the
    tool syntax the server derives for the model (server/chat_setup.py); and that ToolSyntax."""
    from bindings import Model
    from sampling.grammar import compile_framed, compile_grammar
    from sampling.grammar.vocab_index import index_for
    from sampling.vocabulary import TokenVocabulary
    from server.chat_setup import chat_formatter_for
    from server.tools import parse_tools

    with Model(model_path) as model:
        vocab = TokenVocabulary(model.token_bytes, model.eog_tokens, model.special_tokens)
        syntax = chat_formatter_for(model).tool_syntax

    def compile_calls(tools: list[dict], choice: Any) -> None:
        tool_set = parse_tools(tools, choice, None, syntax)
        frame = tool_set.tool_frame()
        if frame is not None:
            compile_framed(frame, vocab)
        else:
            compile_grammar(tool_set.calls_schema(), vocab)

    start = time.perf_counter()
    index_for(vocab)
    out: dict[str, list[float]] = {"vocab_index": [(time.perf_counter() - start) * 1000], "first": [], "reuse": []}
    # The process's first compile also fills process-wide tables (a server pays it once, at its first
    # JSON request): timed apart, on a small function of its own that none of the sets uses.
    warm = [{"type": "function", "function": {"name": "warm_up", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}}}]
    start = time.perf_counter()
    compile_calls(warm, "required")
    out["warm_up"] = [(time.perf_counter() - start) * 1000]
    for i, s in enumerate(sets):
        named = {"type": "function", "function": {"name": s["tools"][i % len(s["tools"])]["function"]["name"]}}
        for choice in ("required", named):  # auto compiles the same grammar as required
            for key in ("first", "reuse"):
                start = time.perf_counter()
                compile_calls(s["tools"], choice)
                out[key].append((time.perf_counter() - start) * 1000)
    return out, syntax


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
    compiles, syntax = compile_times(sets, model_path)
    routes = [ROUTES[name] for name in args.routes]
    ours: dict[str, list[dict]] = {}
    with SpawnedServer(args.model, args.threads, args.concurrency, args.n_ctx) as server:
        model_id = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        walls = {}
        for route in routes:
            started = time.perf_counter()
            ours[route.name] = send_all(server.url, model_id, requests, args.concurrency, route)
            walls[route.name] = time.perf_counter() - started
        # The JSON-schema turn writes the generic calls document: the same tokens only for the generic syntax.
        speeds = speed_pairs(server.url, model_id, sets, args.speed_pairs if syntax.is_generic else 0, args.max_tokens)
    for outcomes in ours.values():
        for o in outcomes:
            record.trial(server="cobatch", **o)
    for p in speeds:
        record.trial(kind="speed", **p)
    record.trial(kind="compile_ms", **{k: [round(v, 2) for v in vs] for k, vs in compiles.items()})
    rows = [row for route in routes for row in validity_rows("cobatch", route.name, ours[route.name])]
    peer_note = "no peer (give --peer-bin or --peer-url for llama-server --jinja on the same requests)"
    binary = peer_binary(args)
    missing: list[str] = []  # routes the peer does not serve
    theirs: dict[str, list[dict]] = {}
    if args.peer_url or binary:
        def peer_runs(url: str) -> dict[str, list[dict]]:
            out = {}
            for route in routes:
                if route_served(url, route):
                    out[route.name] = send_all(url, model_id, requests, args.concurrency, route)
                else:
                    missing.append(route.path)
            return out

        if args.peer_url:
            theirs = peer_runs(args.peer_url)
            peer_note = f"peer: llama-server at {args.peer_url}"
        else:
            with llama_server(binary, model_path, args.threads, args.concurrency, args.n_ctx,
                              extra_args=["--jinja"]) as url:
                theirs = peer_runs(url)
            peer_note = f"peer: {binary} --jinja, started for this run"
        for outcomes in theirs.values():
            for o in outcomes:
                record.trial(server="llama-server", **o)
        rows += [row for route in routes if route.name in theirs
                 for row in validity_rows("llama-server --jinja", route.name, theirs[route.name])]
        if missing:
            peer_note += f"; this llama-server build does not serve {', '.join(missing)} (404)"
    # The headline's figures are the chat route's (as before the other routes were measured), each route's beside.
    first_route = "chat" if "chat" in ours else routes[0].name
    wall = walls[first_route]
    valid_by_route = {name: _valid_share(outcomes) for name, outcomes in ours.items()}
    answered = [o for o in ours[first_route] if o["answered"]]
    valid_share = valid_by_route[first_route]
    first, reuse = compiles["first"], compiles["reuse"]
    ratios = [p["ratio"] for p in speeds]
    same_length = sum(p["tool_tokens"] == p["json_tokens"] for p in speeds)
    table = markdown_table(["server", "route", "tool_choice", "requests", "answered", "complete and valid", "called",
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
               f"requests per route ({', '.join(r.path for r in routes)}: the same conversation, tools and "
               f"tool_choice in each dialect, bench/tool_routes.py), temperature {args.temperature}, max_tokens "
               f"{args.max_tokens}, {args.concurrency} in flight ({wall:.0f} s for cobatch's {ROUTES[first_route].path}). "
               f"{peer_note}.\n\nModel: {model_note(args, model_path)}; cobatch's tool calls: {syntax.describe()}.\n\n{table}\n\n"
               f"Calls-grammar compile for the model's vocabulary, in this process, the server idle (before "
               f"them, once per process and not counted: the vocabulary index, {compiles['vocab_index'][0]:.0f} ms, "
               f"and a first compile of a two-member function none of the sets uses, "
               f"{compiles['warm_up'][0]:.0f} ms):\n\n{compile_table}\n\n"
               + (f"Speed, the same tokens generated both ways:\n\n{speed_table}" if syntax.is_generic else
                  "Speed pairs: not measured (the JSON-schema turn writes the generic document, not this syntax)."))
    headline = {"valid_pct": round(100 * valid_share, 2), "answered": len(answered), "requests": len(ours[first_route]),
                **{f"valid_pct_{name}": round(100 * share, 2) for name, share in valid_by_route.items()},
                "compile_first_p95_ms": round(percentile(first, 95), 2),
                "compile_reuse_p95_ms": round(percentile(reuse, 95), 3),
                # where the model must call: the figure llama-server is compared on
                "valid_pct_required_named": round(100 * _valid_share(ours[first_route], FORCED), 2),
                **({"peer_valid_pct_required_named": round(100 * _valid_share(theirs[first_route], FORCED), 2)}
                   if first_route in theirs else {}),
                "tool_vs_json_tok_s": round(statistics.median(ratios), 3) if ratios else None}
    return summary, headline


def model_note(args: argparse.Namespace, model_path: str) -> str:
    from pathlib import Path

    if args.tiny_family is None:
        return Path(model_path).name
    spec = TINY_FAMILIES[args.tiny_family]
    return (f"{Path(model_path).name}, a tiny random-weight {spec.arch} model with {spec.template}'s chat template "
            f"and the ggml-vocab-{spec.vocab} tokenizer (bench/tiny_model.py): what it writes is noise")


def _valid_share(outcomes: list[dict], modes: tuple[str, ...] = MODES) -> float:
    answered = [o for o in outcomes if o["answered"] and o["mode"] in modes]
    return sum(o["valid"] for o in answered) / max(1, len(answered))


def _routes(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROUTES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"routes are a comma-separated subset of {', '.join(ROUTES)}")
    return names


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
    parser.add_argument("--routes", type=_routes, default=list(ROUTES),
                        help="the dialects every request is sent through (default: chat,responses,messages)")
    add_peer_arguments(parser)  # the peer is started with --jinja
    parser.add_argument("--peer-url", default=None, help="a llama-server already running (with --jinja)")
    parser.add_argument("--tiny-family", choices=sorted(TINY_FAMILIES), default=None,
                        help="instead of --model: a tiny random-weight model with this tool-call family's real chat "
                             "template and tokenizer (bench/tiny_model.py), built once into the cache")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.tiny_family is not None:
        if args.model is not None:
            parser.error("give --model or --tiny-family, not both")
        args.model = str(tiny_model_path(args.tiny_family))
    if args.quick:
        args.sets, args.seeds, args.max_tokens, args.speed_pairs, args.concurrency = 2, 1, 96, 1, 2
    record = RunRecord("tools", args, args.model, argv)
    publish(record, *run(args, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
