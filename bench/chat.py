"""Multi-tenant chat on cobatch serve and llama-server, same run: tok/s, TTFT, prompt tokens computed.

Workload, the same for both servers: 8 tenants, each with its own system prompt of about 500
tokens; 4 users per tenant; 6 turns per user, every turn resending the whole conversation so far
(system prompt, the earlier questions and the answers this server gave) and asking for 48 tokens
(`ignore_eos`, so both generate the same counts). 16 conversations are in flight: a client worker
runs one conversation's turns in order, then takes the next; conversations are queued tenant by
tenant in turn, so users of one tenant talk at the same time.

Before the chat, on the freshly started server, a burst: 16 requests sharing one new system
prompt of about 500 tokens, each with its own question, sent together. cobatch computes the
shared prompt once (a leader prefills it, the others wait for its blocks); llama-server computes
it in every slot.

Prompt tokens computed: cobatch's from /metrics (`cobatch_tokens_prefilled_total`, before and
after); llama-server's from the `timings.prompt_n` of each final chunk (tokens it evaluated, its
slot cache's hits excluded). llama-server runs with one slot per conversation in flight, a unified
KV cache and flash attention (`-np 16 -kvu -fa on`) and its prompt cache on, as by default;
cobatch serve with its defaults. Both are started fresh for every trial, in an order alternating
between trials; ratios are taken within a trial, then their median.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.http_targets import Cobatch, LlamaCpp, Sample, SpawnedServer, Target
from bench.peer import add_peer_arguments, llama_server, peer_binary
from bench.record import RunRecord, add_common_arguments, publish_report
from bench.stats import percentile
from bench.table import markdown_table
from engine.model_source import resolve_model

_TOPICS = ("opening hours", "returns", "delivery times", "payment methods", "warranty claims",
           "gift cards", "loyalty points", "store locations", "product care", "data privacy")
_QUESTIONS = ("Can you help me with my last order?", "What are your opening hours on weekends?",
              "How do I return a damaged item?", "Do you deliver to small villages?",
              "Which payment methods do you accept?", "How long does the warranty last?",
              "Can I combine two discount codes?", "Where is your nearest store?")


def system_prompt(name: str, words: int) -> str:
    """A tenant's system prompt: `name` first, so no two tenants share a block, then policy text."""
    sentences = [f"You are the customer assistant of {name}."]
    i = 0
    while sum(len(s.split()) for s in sentences) < words:
        topic = _TOPICS[i % len(_TOPICS)]
        sentences.append(f"Rule {i + 1} of {name} about {topic}: answer questions on {topic} briefly, politely "
                         f"and accurately, quote the policy of {name} where it applies, and offer to pass the "
                         f"customer to a human colleague when unsure.")
        i += 1
    return " ".join(sentences) + "\n\n"


def question(user: int, turn: int) -> str:
    return f"User {user}: {_QUESTIONS[(user + turn) % len(_QUESTIONS)]}"


@dataclass
class Workload:
    tenants: int = 8
    users: int = 4
    turns: int = 6
    answer_tokens: int = 48
    in_flight: int = 16
    system_words: int = 330  # about 500 tokens with this model's tokenizer
    burst: int = 16


@dataclass
class Turn:
    sample: Sample
    prompt_computed: int | None  # llama-server's own count for this request; None for cobatch


@dataclass
class Side:
    """One server's trial."""

    burst: list[Turn] = field(default_factory=list)
    burst_wall_s: float = 0.0
    burst_computed: int = 0
    chat: list[Turn] = field(default_factory=list)
    chat_wall_s: float = 0.0
    chat_computed: int = 0

    def figures(self) -> dict[str, Any]:
        ok = [t.sample for t in self.chat if t.sample.ok]
        burst = [t.sample for t in self.burst if t.sample.ok]
        return {
            "chat_requests": len(self.chat), "chat_failed": len(self.chat) - len(ok),
            "chat_tok_s": sum(s.tokens for s in ok) / self.chat_wall_s if self.chat_wall_s else 0.0,
            "chat_ttft_p50_ms": percentile([s.ttft_s * 1000 for s in ok], 50) if ok else None,
            "chat_ttft_p95_ms": percentile([s.ttft_s * 1000 for s in ok], 95) if ok else None,
            "chat_computed_per_request": self.chat_computed / max(1, len(self.chat)),
            "burst_failed": len(self.burst) - len(burst), "burst_wall_s": self.burst_wall_s,
            "burst_ttft_p50_ms": percentile([s.ttft_s * 1000 for s in burst], 50) if burst else None,
            "burst_computed": self.burst_computed,
        }


async def prefilled(client: httpx.AsyncClient, target: Target) -> int | None:
    """cobatch's prompt tokens computed so far, from /metrics (None for another server)."""
    if not isinstance(target, Cobatch):
        return None
    text = (await client.get(target.url + "/metrics")).text
    for line in text.splitlines():
        if line.startswith("cobatch_tokens_prefilled_total "):
            return int(float(line.split()[1]))
    raise RuntimeError("cobatch's /metrics has no cobatch_tokens_prefilled_total")


def peer_computed(sample: Sample) -> int | None:
    timings = sample.final.get("timings") or {}
    return int(timings["prompt_n"]) if "prompt_n" in timings else None


async def run_side(target: Target, work: Workload) -> Side:
    side = Side()
    limits = httpx.Limits(max_connections=work.in_flight * 2 + work.burst)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0, connect=30.0), limits=limits) as client:
        warm = await target.one(client, "Warm-up: the quick brown fox")
        if not warm.ok:
            raise RuntimeError(f"{target.name} at {target.url}: warm-up request failed: {warm.error}")
        # The burst: one new system prompt, `burst` questions, sent together.
        shared = system_prompt("Burst Bakery", work.system_words)
        before = await prefilled(client, target)
        start = time.perf_counter()
        samples = await asyncio.gather(*(target.one(client, f"{shared}{question(u, 0)}\nAssistant:")
                                         for u in range(work.burst)))
        side.burst_wall_s = time.perf_counter() - start
        side.burst = [Turn(s, peer_computed(s)) for s in samples]
        after = await prefilled(client, target)
        side.burst_computed = (after - before) if before is not None else sum(t.prompt_computed or 0 for t in side.burst)
        # The chat.
        systems = [system_prompt(f"Tenant {t} Outfitters", work.system_words) for t in range(work.tenants)]
        queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        for user in range(work.users):
            for tenant in range(work.tenants):
                queue.put_nowait((tenant, user))

        async def worker() -> None:
            while True:
                try:
                    tenant, user = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                history = systems[tenant]
                for turn in range(work.turns):
                    history += f"{question(user, turn)}\nAssistant:"
                    sample = await target.one(client, history)
                    side.chat.append(Turn(sample, peer_computed(sample)))
                    if not sample.ok:
                        return  # the conversation cannot go on without its answer
                    history += f"{sample.text}\n"

        before = await prefilled(client, target)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(work.in_flight)))
        side.chat_wall_s = time.perf_counter() - start
        after = await prefilled(client, target)
        side.chat_computed = (after - before) if before is not None else sum(t.prompt_computed or 0 for t in side.chat)
    return side


def shared_burst_bound(model: str | None, work: Workload) -> tuple[int, int]:
    """(tokens of the burst's shared system prompt, tokens of its 16 suffixes together)."""
    from bindings import Model

    m = Model(str(resolve_model(model)))
    try:
        shared = system_prompt("Burst Bakery", work.system_words)
        n_shared = len(m.tokenize(shared))
        suffixes = sum(len(m.tokenize(f"{shared}{question(u, 0)}\nAssistant:")) - n_shared for u in range(work.burst))
        return n_shared, suffixes
    finally:
        m.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench chat", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-ctx", type=int, default=32768, help="KV cells, the same for both servers")
    add_common_arguments(parser, trials=3)
    add_peer_arguments(parser)
    args = parser.parse_args(argv)
    work = Workload()
    if args.quick:
        work = Workload(tenants=2, users=2, turns=2, answer_tokens=4, in_flight=2, system_words=60, burst=3)
        args.trials, args.n_ctx = 1, 4096
    binary = peer_binary(args)
    model = str(resolve_model(args.model))
    record = RunRecord("chat", args, args.model, argv)
    n_shared, suffixes = shared_burst_bound(args.model, work)
    sides: list[dict[str, Side]] = []
    try:
        for trial in range(args.trials):
            names = ["cobatch"] + (["peer"] if binary else [])
            if trial % 2:
                names.reverse()
            trial_sides: dict[str, Side] = {}
            for name in names:
                if name == "cobatch":
                    context: Any = SpawnedServer(args.model, args.threads, max(16, work.in_flight), args.n_ctx)
                    make = lambda url: Cobatch(url, work.answer_tokens, ignore_eos=True)  # noqa: E731
                else:
                    context = llama_server(binary, model, args.threads, work.in_flight, args.n_ctx,
                                           extra_args=["-fa", "on"])
                    make = lambda url: LlamaCpp(url, work.answer_tokens, ignore_eos=True, cache_prompt=True)  # noqa: E731
                with context as handle:
                    url = handle.url if isinstance(handle, SpawnedServer) else handle
                    trial_sides[name] = asyncio.run(run_side(make(url), work))
                figures = trial_sides[name].figures()
                record.trial(trial=trial, server=name, **figures)
                print(f"trial {trial} {name}: {figures['chat_tok_s']:.1f} tok/s, TTFT p50 "
                      f"{figures['chat_ttft_p50_ms']:.0f} ms, burst computed {figures['burst_computed']}",
                      file=sys.stderr)
            sides.append(trial_sides)
    except (RuntimeError, OSError) as exc:
        print(f"chat: {exc}", file=sys.stderr)
        return 1
    publish_report(record, lambda: report(sides, work, n_shared, suffixes))
    return 0


def report(sides: list[dict[str, Side]], work: Workload, n_shared: int, suffixes: int) -> tuple[str, dict]:
    names = list(sides[0])
    per = {n: [s[n].figures() for s in sides] for n in names}
    med = lambda n, k: statistics.median(f[k] for f in per[n] if f[k] is not None)  # noqa: E731
    keys = [("chat tok/s", "chat_tok_s"), ("chat TTFT p50 ms", "chat_ttft_p50_ms"),
            ("chat TTFT p95 ms", "chat_ttft_p95_ms"), ("prompt tokens computed per chat request", "chat_computed_per_request"),
            ("burst: prompt tokens computed", "burst_computed"), ("burst: TTFT p50 ms", "burst_ttft_p50_ms"),
            ("burst: total s", "burst_wall_s")]
    rows = [[label] + [med(n, k) for n in names] for label, k in keys]
    headline: dict[str, Any] = {"chat_tok_s": round(med("cobatch", "chat_tok_s"), 1),
                                "burst_computed": med("cobatch", "burst_computed")}
    bound = 1.1 * (n_shared + suffixes)
    lines = [f"{len(sides)} trial(s); figures are medians over trials, ratios the median of each trial's ratio. "
             f"Chat: {work.tenants} tenants x {work.users} users x {work.turns} turns, {work.answer_tokens}-token "
             f"answers, {work.in_flight} conversations in flight. Burst: {work.burst} requests sharing a "
             f"{n_shared}-token system prompt, {suffixes} suffix tokens in all; target for prompt tokens "
             f"computed: at most 1.1 x (shared + suffixes) = {bound:.0f}.", ""]
    if "peer" in names:
        ratio = lambda k: statistics.median(a[k] / b[k] for a, b in zip(per["cobatch"], per["peer"]) if b[k])  # noqa: E731
        for row, (_, k) in zip(rows, keys):
            row.append(ratio(k))
        headline.update(tok_s_ratio=round(ratio("chat_tok_s"), 2), ttft_p50_ratio=round(ratio("chat_ttft_p50_ms"), 2),
                        burst_ttft_ratio=round(ratio("burst_ttft_p50_ms"), 2))
        names = names + ["cobatch / llama-server"]
    lines.append(markdown_table(["figure"] + [n if n != "peer" else "llama-server" for n in names], rows))
    failed = {n: sum(f["chat_failed"] + f["burst_failed"] for f in per[n]) for n in per}
    lines.append("")
    lines.append("Failed requests: " + ", ".join(f"{n} {c}" for n, c in failed.items()))
    return "\n".join(lines), headline


if __name__ == "__main__":
    sys.exit(main())
