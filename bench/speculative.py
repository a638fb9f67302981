"""Speculative decoding end to end: `cobatch serve --speculative auto` against `--speculative off`
and llama-server with no speculation, `--spec-type ngram-simple` and `--spec-type ngram-mod`, on
the same requests, at one client and at sixteen (issue 45's "What it must show").

Workloads (bench/speculative_workloads.py), greedy (temperature 0), `--tokens` tokens each
(`ignore_eos`, so every contender generates the same count), every request distinct:

  paragraph   repeat a paragraph given in the prompt                      drafts should pay
  story       an open story, which the small model repeats itself on       drafts should pay
  rename      rewrite a function with one name changed
  json-rows   continue rows of JSON lines
  agent-echo  a chat whose earlier tool result the model is asked to restate
  json-job    many short chats with one JSON schema (`response_format`), ended by the grammar
              (no ignore_eos), every answer checked against the schema

Plain prompts go to /v1/completions as token ids; the chats go to cobatch's /v1/chat/completions
and, as the same token ids (checked against cobatch's `usage.prompt_tokens`), to llama-server's
/v1/completions, the schema as its `json_schema`.

Each contender is its own server process, all up at once and each idle while another works.
Within a trial every workload runs at every concurrency C (C closed-loop clients) on every
contender back to back, the contenders' order reversed on odd trials; tok/s is the servers'
completion tokens over the wall time from the first send to the last answer. Ratios are taken
within a trial, then their median. Drafted and accepted tokens: cobatch's from each response's
non-standard `metrics` object (`drafted_tokens`, `accepted_tokens`) when the server reports them,
llama-server's from its `timings` (`draft_n`, `draft_n_accepted`).

Exactness: under greedy decoding `auto` should return `off`'s tokens for every request; both
return their token ids (`return_token_ids`). Where they differ, `off` is asked once more, alone,
for the next token after the prefix both share (the prompt and the tokens before the first that
differs, as one prompt), with the 20 likeliest tokens' logprobs: how much it prefers its own token
there over auto's is reported. A gap below `--near-tie-nats` (twice the largest move of a row's
logprob that bench invariance measured with the step's shape alone: two tokens' logprobs moving
apart) is a near-tie that the extra draft rows may flip (a negative one: off itself picks auto's
token when the prefix is computed another way); anything larger would be a bug.

`--aa` starts the `auto` server with `--speculative off` too: an A/A, whose ratios and partings
are what two servers without drafts differ by on this machine at each concurrency (the noise a
ratio is read against, and how far the batch's history alone parts greedy texts there).

Targets (issue 45), shown beside each figure: at C=1, auto >= 1.5x off on paragraph and story,
>= 0.97x off elsewhere, and >= every llama-server mode on each workload; at C=16 >= 0.98x off on
every workload; the JSON job above off at both, with every answer valid.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import httpx

from bench.peer import add_peer_arguments, llama_server, peer_binary, speculation_args
from bench.record import RunRecord, add_common_arguments, publish_report
from bench.speculative_workloads import WORKLOADS, Ask, Renderer, Workload
from bench.table import markdown_table

COBATCH_MODES = ("auto", "off")
PEER_MODES = {"llama-server": "none", "ngram-simple": "ngram-simple", "ngram-mod": "ngram-mod"}
# bench invariance (run 20261130T130631Z): with the step's shape alone a row's logprob moved by up to
# 0.451 nats (flash attention off; 0.366 on, as `cobatch serve` runs; 0.341 in a drafted step of 64
# rows or more, ggml's tiled kernel); two candidates moving apart: twice the largest.
NEAR_TIE_NATS = 0.9


@dataclass
class Answer:
    key: str
    ok: bool
    text: str = ""
    tokens: int = 0
    prompt_tokens: int = 0
    drafted: int | None = None  # None: the server does not report it
    accepted: int | None = None
    latency_s: float = 0.0
    valid: bool | None = None  # JSON job only: valid against the schema
    error: str = ""
    token_ids: list[int] | None = None  # cobatch's (return_token_ids), for exactness


class Contender:
    """One server under test and how it is asked: cobatch (chats on its chat route) or llama-server."""

    def __init__(self, name: str, url: str, cobatch: bool) -> None:
        self.name, self.url, self.cobatch = name, url.rstrip("/"), cobatch
        self.model = httpx.get(f"{self.url}/v1/models", timeout=30).json()["data"][0]["id"]

    def request(self, ask: Ask, tokens: int) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": tokens, "temperature": 0.0}
        if self.cobatch:
            body["return_token_ids"] = True
        if ask.ignore_eos:
            body["ignore_eos"] = True
        if self.cobatch and ask.messages is not None:
            body["messages"] = ask.messages
            if ask.schema is not None:
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ask.schema}}
            return "/v1/chat/completions", body
        body["prompt"] = ask.prompt_ids
        if ask.schema is not None:
            body["json_schema"] = ask.schema  # llama-server's field (cobatch has no schema on this route)
        return "/v1/completions", body

    async def ask(self, client: httpx.AsyncClient, ask: Ask, tokens: int) -> Answer:
        path, body = self.request(ask, tokens)
        start = time.perf_counter()
        try:
            r = await client.post(self.url + path, json=body)
        except httpx.HTTPError as exc:
            return Answer(ask.key, False, error=f"{type(exc).__name__}: {exc}")
        latency = time.perf_counter() - start
        if r.status_code != 200:
            return Answer(ask.key, False, latency_s=latency, error=f"HTTP {r.status_code}: {r.text[:200]}")
        data = r.json()
        choice = data["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        answer = Answer(ask.key, True, text or "", int(data["usage"]["completion_tokens"]),
                        int(data["usage"]["prompt_tokens"]), latency_s=latency)
        answer.drafted, answer.accepted = self.drafts(data)
        answer.token_ids = choice.get("token_ids")
        if ask.schema is not None:
            answer.valid = json_valid(answer.text, ask.schema)
        return answer

    def drafts(self, data: dict[str, Any]) -> tuple[int | None, int | None]:
        if self.cobatch:
            metrics = data.get("metrics") or {}
            return metrics.get("drafted_tokens"), metrics.get("accepted_tokens")
        timings = data.get("timings")
        if timings is None:
            return None, None
        return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))


def json_valid(text: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@dataclass
class Level:
    """One contender's run of one workload at one concurrency in one trial."""

    trial: int
    concurrency: int
    workload: str
    contender: str
    wall_s: float
    answers: list[Answer] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return sum(a.tokens for a in self.answers if a.ok) / self.wall_s

    def counted(self, what: str) -> int | None:
        values = [getattr(a, what) for a in self.answers if a.ok]
        return None if not values or any(v is None for v in values) else sum(values)


async def run_level(contender: Contender, client: httpx.AsyncClient, asks: list[Ask], concurrency: int,
                    tokens: int) -> tuple[float, list[Answer]]:
    queue: asyncio.Queue[Ask] = asyncio.Queue()
    for ask in asks:
        queue.put_nowait(ask)
    answers: list[Answer] = []

    async def client_loop() -> None:
        while not queue.empty():
            answers.append(await contender.ask(client, queue.get_nowait(), tokens))

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return time.perf_counter() - start, sorted(answers, key=lambda a: a.key)


async def measure(args: argparse.Namespace, contenders: list[Contender], renderer: Renderer,
                  record: RunRecord) -> tuple[list[Level], dict[str, Ask]]:
    limits = httpx.Limits(max_connections=2 * max(args.concurrency), max_keepalive_connections=2 * max(args.concurrency))
    levels: list[Level] = []
    asked: dict[str, Ask] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0, connect=30.0), limits=limits) as client:
        warm = renderer.plain("Warm-up: the quick brown fox")
        for c in contenders:  # first decodes allocate buffers and graphs
            answer = await c.ask(client, warm, 8)
            if not answer.ok:
                raise RuntimeError(f"{c.name}: the warm-up request failed: {answer.error}")
        for trial in range(args.trials):
            order = contenders if trial % 2 == 0 else contenders[::-1]
            for i, concurrency in enumerate(args.concurrency):
                for workload in selected(args):
                    count = (args.job_requests if workload.json_job else args.requests)[i]
                    asks = workload.asks(renderer, concurrency, trial, count)
                    asked.update((a.key, a) for a in asks)
                    for c in order:
                        wall, answers = await run_level(c, client, asks, concurrency, args.tokens)
                        level = Level(trial, concurrency, workload.name, c.name, wall, answers)
                        levels.append(level)
                        record.trial(**{**asdict(level), "tok_s": round(level.tok_s, 2)})
                    print(f"trial {trial} C={concurrency} {workload.name}: " + ", ".join(
                        f"{lv.contender} {lv.tok_s:.1f}" for lv in levels[-len(order):]) + " tok/s",
                        file=sys.stderr, flush=True)
    return levels, asked


def selected(args: argparse.Namespace) -> list[Workload]:
    return [w for w in WORKLOADS if w.name in args.workloads]


# ---------------------------------------------------------------------------------------------
# Exactness: auto's texts against off's


@dataclass
class Difference:
    key: str
    concurrency: int
    workload: str
    at_char: int  # first differing character (the texts' length where only the tokens differ)
    at_token: int | None = None  # first differing token (None: a server gave no token ids)
    auto_token: int | None = None  # the tokens there (None: that answer ended before it)
    off_token: int | None = None
    gap_nats: float | None = None  # off alone, after the shared prefix: its token's logprob minus auto's
    note: str = ""


def differences(levels: list[Level]) -> list[Difference]:
    found = []
    by = {(lv.trial, lv.concurrency, lv.workload, lv.contender): lv for lv in levels}
    for (trial, concurrency, workload, contender), auto in by.items():
        off = by.get((trial, concurrency, workload, "off"))
        if contender != "auto" or off is None:
            continue
        theirs = {a.key: a for a in off.answers if a.ok}
        for mine in auto.answers:
            other = theirs.get(mine.key)
            if not mine.ok or other is None:
                continue
            at_char = common_prefix(mine.text, other.text)
            if mine.token_ids is None or other.token_ids is None:
                if mine.text != other.text:
                    found.append(Difference(mine.key, concurrency, workload, at_char))
            elif mine.token_ids != other.token_ids:
                j = common_prefix(mine.token_ids, other.token_ids)
                found.append(Difference(mine.key, concurrency, workload, at_char, j, _at(mine.token_ids, j),
                                        _at(other.token_ids, j)))
    return sorted(found, key=lambda d: d.concurrency)


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _at(tokens: list[int], i: int) -> int | None:
    return tokens[i] if i < len(tokens) else None


async def measure_gaps(off: Contender, found: list[Difference], asked: dict[str, Ask],
                       off_ids: dict[str, list[int]], token_bytes: Sequence[bytes], limit: int) -> None:
    """For the first `limit` differences with token ids: `off` alone computes the next token after
    the prefix auto and off share, with the 20 likeliest tokens' logprobs; the gap is how much it
    prefers off's token there over auto's."""
    def text(token: int) -> str:  # as the server keys top_logprobs
        return token_bytes[token].decode("utf-8", "replace")

    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0, connect=30.0)) as client:
        for n, d in enumerate(found):
            if d.at_token is None:
                d.note = "no token ids"
                continue
            if d.auto_token is None or d.off_token is None:
                d.note = "one answer ends where the other goes on"
                continue
            if n >= limit:
                d.note = f"past --gap-checks {limit}"
                continue
            if text(d.auto_token) == text(d.off_token):
                d.note = "the two tokens have the same text"
                continue
            body = {"model": off.model, "prompt": asked[d.key].prompt_ids + off_ids[d.key][:d.at_token],
                    "max_tokens": 1, "temperature": 0.0, "logprobs": 20, "ignore_eos": True}
            r = await client.post(off.url + "/v1/completions", json=body)
            if r.status_code != 200:
                d.note = f"recheck refused: HTTP {r.status_code}"
                continue
            tops = r.json()["choices"][0]["logprobs"]["top_logprobs"]
            top = tops[0] if tops else {}
            theirs, mine = top.get(text(d.off_token)), top.get(text(d.auto_token))
            if theirs is None:
                d.note = "off's token is not among its 20 likeliest when recomputed"
            elif mine is None:  # a bound: auto's is below the least of them
                d.gap_nats, d.note = round(theirs - min(top.values()), 4), "at least: auto's token is not among its 20 likeliest"
            else:
                d.gap_nats = round(theirs - mine, 4)


# ---------------------------------------------------------------------------------------------
# The report


def target_for(workload: Workload, concurrency: int) -> tuple[float, bool]:
    """(the least auto/off ratio the issue asks for, whether it must be strictly above)."""
    if workload.json_job:
        return 1.0, True
    if concurrency == 1:
        return (1.5 if workload.drafts_pay else 0.97), False
    return 0.98, False


def ratios(levels: list[Level], workload: str, concurrency: int, other: str) -> list[float]:
    """auto's tok/s over `other`'s, per trial."""
    out = []
    for trial in sorted({lv.trial for lv in levels}):
        pair = {lv.contender: lv for lv in levels
                if (lv.trial, lv.workload, lv.concurrency) == (trial, workload, concurrency)}
        if "auto" in pair and other in pair and pair[other].tok_s > 0:
            out.append(pair["auto"].tok_s / pair[other].tok_s)
    return out


def ratio_cell(values: list[float]) -> str:
    if not values:
        return "-"
    cell = f"{statistics.median(values):.2f}"
    return cell + (" (" + ", ".join(f"{v:.2f}" for v in values) + ")" if len(values) > 1 else "")


def drafts_cell(group: list[Level]) -> str:
    drafted = [lv.counted("drafted") for lv in group]
    accepted = [lv.counted("accepted") for lv in group]
    if any(v is None for v in drafted + accepted):
        return "not reported"
    d, a = sum(drafted), sum(accepted)  # type: ignore[arg-type]
    return f"{a}/{d}" + (f" ({a / d:.0%})" if d else "")


def report(args: argparse.Namespace, levels: list[Level], diffs: list[Difference], names: list[str],
           binary: str | None, prompt_mismatches: list[str]) -> tuple[str, dict[str, Any]]:
    peers = [n for n in names if n in PEER_MODES]
    speed_rows, detail_rows = [], []
    headline: dict[str, Any] = {}
    misses: list[str] = []
    for concurrency in args.concurrency:
        for workload in selected(args):
            group = [lv for lv in levels if lv.workload == workload.name and lv.concurrency == concurrency]
            if not group:
                continue
            tok_s = {n: statistics.median(lv.tok_s for lv in group if lv.contender == n) for n in names}
            vs = {n: ratios(levels, workload.name, concurrency, n) for n in names if n != "auto"}
            least, strict = target_for(workload, concurrency)
            missed = []
            if vs.get("off"):
                r = statistics.median(vs["off"])
                headline[f"{workload.name}_c{concurrency}_auto_over_off"] = round(r, 3)
                if r < least or (strict and r <= least):
                    missed.append(f"auto/off {r:.2f} {'<=' if strict else '<'} {least}")
            if concurrency == 1:
                for n in peers:
                    if vs.get(n) and (r := statistics.median(vs[n])) < 1.0:
                        missed.append(f"auto/{n} {r:.2f} < 1")
            auto_answers = [a for lv in group if lv.contender == "auto" for a in lv.answers]
            if workload.json_job and not all(a.valid for a in auto_answers):
                missed.append("invalid JSON from auto")
            goal = f"{'>' if strict else '>='} {least}x off" + (", >= each llama-server mode" if concurrency == 1
                                                                  and peers else "")
            misses += [f"C={concurrency} {workload.name}: {m}" for m in missed]
            speed_rows.append([concurrency, workload.label, len(group[0].answers),
                               *[f"{tok_s[n]:.1f}" for n in names], *[ratio_cell(vs[n]) for n in names if n != "auto"],
                               goal, "met" if not missed else "**missed**: " + "; ".join(missed)])
            mine = [d for d in diffs if d.workload == workload.name and d.concurrency == concurrency]
            gaps = [d.gap_nats for d in mine if d.gap_nats is not None]
            ties = sum(1 for g in gaps if g < args.near_tie_nats)
            valid = ""
            if workload.json_job:
                valid = ", ".join(f"{n} {sum(bool(a.valid) for lv in group if lv.contender == n for a in lv.answers)}"
                                  f"/{sum(len(lv.answers) for lv in group if lv.contender == n)}" for n in names)
            detail_rows.append([concurrency, workload.label,
                                *[drafts_cell([lv for lv in group if lv.contender == n])
                                  for n in names if n not in ("off", "llama-server")],
                                f"{len(auto_answers) - len(mine)}/{len(auto_answers)}",
                                f"{ties} near-tie(s), {len(gaps) - ties} wider, {len(mine) - len(gaps)} unmeasured"
                                if mine else "-",
                                valid or "-"])
    drafting = [n for n in names if n not in ("off", "llama-server")]
    speed_table = markdown_table(["C", "workload", "requests", *[f"{n} tok/s" for n in names],
                                  *[f"auto / {n}" for n in names if n != "auto"], "target", "result"], speed_rows)
    detail_table = markdown_table(["C", "workload", *[f"{n} accepted/drafted" for n in drafting],
                                   "auto tokens = off tokens", "differing: off's preference at the first differing token",
                                   "valid JSON"], detail_rows)
    gap_lines = [f"- {d.key}: parts at " + (f"token {d.at_token} (character {d.at_char}); off prefers its token "
                                             "there by " if d.at_token is not None else f"character {d.at_char}; ")
                 + (f"{d.gap_nats} nats" + (f" ({d.note})" if d.note else "") if d.gap_nats is not None
                    else f"not measured ({d.note})") for d in diffs]
    peer_note = (f"llama-server: `{binary} -m MODEL -t {args.threads} -np {max(args.concurrency)} -kvu "
                 f"-c {args.n_ctx} --no-repack` (where the CPU has AMX, as cobatch) plus `--spec-type ngram-simple` / "
                 "`--spec-type ngram-mod` (their default n-gram settings)" if binary
                 else "no llama-server (give --peer-bin)")
    aa_note = ("**A/A: the server named auto runs `--speculative off` too**; its ratios and partings are two "
               "servers without drafts. " if args.aa else "")
    lines = [
        f"{aa_note}{args.trials} trial(s), contenders in reverse order on odd trials; greedy, {args.tokens} tokens "
        f"(ignore_eos, except the JSON job); cobatch serve --threads {args.threads} --n-ctx {args.n_ctx} "
        f"--max-running 32 --step-token-budget 256 --speculative auto|off; {peer_note}. tok/s: medians over "
        "trials; ratios: median of the per-trial ratios (each trial's in brackets).", "", speed_table, "",
        f"Drafts and exactness. A near-tie: where the token ids part, off (asked again alone, the shared prefix "
        f"as its prompt) prefers its own token over auto's by less than {args.near_tie_nats} nats (negative: it "
        "picks auto's).", "", detail_table]
    if gap_lines:
        lines += ["", "Requests whose auto tokens differ from off's:", *gap_lines]
    if prompt_mismatches:
        lines += ["", "Chat prompts whose cobatch token count differs from the ids llama-server got: "
                  + ", ".join(prompt_mismatches)]
    if any("not reported" in str(cell) for row in detail_rows for cell in row):
        lines += ["", "cobatch reports no drafted/accepted tokens in its responses' `metrics` yet: not shown."]
    lines += ["", "Targets missed: " + ("none" if not misses else "; ".join(misses))]
    headline["targets_missed"] = len(misses)
    if args.aa:
        headline["aa"] = True
    headline["auto_equal_off"] = f"{sum(len(lv.answers) for lv in levels if lv.contender == 'auto') - len(diffs)}" \
                                 f"/{sum(len(lv.answers) for lv in levels if lv.contender == 'auto')}"
    return "\n".join(lines), headline


# ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, record: RunRecord) -> None:
    from bench.http_targets import SpawnedServer
    from bindings import Model
    from engine.model_source import resolve_model

    model_path = str(resolve_model(args.model))
    binary = peer_binary(args)
    servers = [SpawnedServer(args.model, args.threads, 32, args.n_ctx, ["--speculative", "off" if args.aa else mode])
               for mode in COBATCH_MODES]
    with Model(model_path) as model, contextlib.ExitStack() as stack:
        renderer = Renderer(model)
        contenders = [Contender(mode, stack.enter_context(s).url, True) for mode, s in zip(COBATCH_MODES, servers)]
        if binary:
            for name, spec_type in PEER_MODES.items():
                url = stack.enter_context(llama_server(binary, model_path, args.threads, max(args.concurrency),
                                                       args.n_ctx, extra_args=speculation_args(spec_type)))
                contenders.append(Contender(name, url, False))
        levels, asked = asyncio.run(measure(args, contenders, renderer, record))
        off_ids = {a.key: a.token_ids or [] for lv in levels if lv.contender == "off" for a in lv.answers}
        diffs = differences(levels)
        asyncio.run(measure_gaps(contenders[1], diffs, asked, off_ids, model.token_bytes, args.gap_checks))
    for d in diffs:
        record.trial(difference=asdict(d))
    mismatches = sorted({a.key for lv in levels if lv.contender == "auto" for a in lv.answers
                         if a.ok and asked[a.key].messages is not None and a.prompt_tokens != len(asked[a.key].prompt_ids)})
    publish_report(record, lambda: report(args, levels, diffs, [c.name for c in contenders], binary, mismatches))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench speculative", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    parser.add_argument("--concurrency", type=ints, default=[1, 16], help="client counts (comma-separated)")
    parser.add_argument("--requests", type=ints, default=[3, 16],
                        help="requests per workload at each concurrency (comma-separated, one per level)")
    parser.add_argument("--job-requests", type=ints, default=[80, 500],
                        help="requests of the JSON job at each concurrency (its drafts come from its own earlier "
                             "answers: at one stream, 10 were too few to show them, docs/benchmarks.md)")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens of every request")
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=[w.name for w in WORKLOADS],
                        help="comma-separated subset of: " + ", ".join(w.name for w in WORKLOADS))
    parser.add_argument("--n-ctx", type=int, default=8192, help="KV cells, for every server")
    parser.add_argument("--near-tie-nats", type=float, default=NEAR_TIE_NATS,
                        help="a difference where off prefers its token by less than this is counted as a near-tie")
    parser.add_argument("--gap-checks", type=int, default=300,
                        help="differing requests re-asked for off's top-2 gap, at most (C=1 first)")
    parser.add_argument("--aa", action="store_true",
                        help="an A/A: the auto server runs --speculative off too (the noise of ratios and partings)")
    add_peer_arguments(parser)
    add_common_arguments(parser, trials=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.requests, args.job_requests, args.tokens, args.trials = [1, 2], [1, 2], [2, 2], 12, 1
        args.n_ctx = 2048
    unknown = set(args.workloads) - {w.name for w in WORKLOADS}
    if unknown or not (len(args.concurrency) == len(args.requests) == len(args.job_requests)):
        parser.error(f"unknown workloads {sorted(unknown)}" if unknown else
                     "--concurrency, --requests and --job-requests need one value per level each")
    run(args, RunRecord("speculative", args, args.model, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
