"""Long prompts, as a new user meets them: prefill speed beside llama-server, and the wait of a chat
that arrives during a long prefill.

Both servers run at once in their own processes, each idle while the other works; trials alternate
which goes first. Every request is a distinct prompt (a seeded word stream, tokenized here and sent
as the same token ids to both, so neither finds a cached prefix), `max_tokens` 1, greedy, on
/v1/completions:

- one at a time, one prompt of each `--lengths` (default 3k, 11k, 23k tokens);
- `--parallel` prompts of `--parallel-length` tokens at once (default 4 of 9k).

tok/s is prompt tokens over the client's wall time until the answer (the whole batch's for the
parallel case), so it includes everything a user waits for. Then chats: a short prompt asked
alone (idle TTFT, median of three), and again while the server works on a fresh prompt of the
longest length, `--chat-delay` seconds after it and every `--chat-every` seconds after that until
it is done, each on its own connection; cobatch gets them as `priority: "interactive"` (the long
prompt is batch work), llama-server as plain requests. TTFT is the first streamed token. The long
prompt's tok/s beside the chats, over the same length's alone, is what the interruptions cost it.

cobatch runs as `cobatch serve` with its defaults and `--n-ctx`; llama-server as the issue measured
it: `-np 4 -kvu -fa on -c N_CTX` (bench/peer.py adds the CPU-safety flags both share).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from bench.peer import add_peer_arguments, llama_server, peer_binary
from bench.prompts import TOPICS
from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table

CHAT_PROMPT = "Question: What is the capital of France?\nAnswer:"


def word_stream_tokens(tokenize: Any, n_tokens: int, seed: int) -> list[int]:
    """`n_tokens` token ids of a seeded stream of words (BOS first): distinct from the first words on."""
    words = " ".join(TOPICS).replace("(", "").split()
    rng = random.Random(seed)
    text = f"Document {seed}."
    tokens: list[int] = []
    while len(tokens) < n_tokens:
        text += " " + " ".join(rng.choice(words) for _ in range(4 * n_tokens // 3 + 64))
        tokens = tokenize(text)
    return tokens[:n_tokens]


class Server:
    """One server under test: where it listens, and what it calls the model."""

    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url
        self.model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]

    def complete(self, tokens: list[int]) -> float:
        """Seconds until a one-token answer to the prompt (cobatch's default priority: batch)."""
        body: dict[str, Any] = {"model": self.model, "prompt": tokens, "max_tokens": 1, "temperature": 0.0}
        start = time.perf_counter()
        r = httpx.post(f"{self.url}/v1/completions", json=body, timeout=1800)
        r.raise_for_status()
        return time.perf_counter() - start

    def ttft(self, prompt: str) -> float:
        """Seconds to the first streamed token of a short interactive answer."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
                                "stream": True}
        if self.name.startswith("cobatch"):
            body["priority"] = "interactive"
        start = time.perf_counter()
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    choice = json.loads(line[6:])["choices"][0]
                    if choice.get("text"):
                        return time.perf_counter() - start
        raise RuntimeError(f"{self.name}: the chat answer streamed no text")


def one_trial(server: Server, prompts: dict[str, list[list[int]]], chat_delay: float, chats: int,
              chat_every: float) -> dict[str, Any]:
    out: dict[str, Any] = {"server": server.name}
    for tokens in prompts["single"]:
        out[f"single_{len(tokens)}_tok_s"] = round(len(tokens) / server.complete(tokens), 1)
    parallel = prompts["parallel"]
    start = time.perf_counter()
    with ThreadPoolExecutor(len(parallel)) as pool:
        list(pool.map(server.complete, parallel))
    out["parallel_tok_s"] = round(sum(map(len, parallel)) / (time.perf_counter() - start), 1)
    out["chat_idle_ttft_ms"] = round(1000 * statistics.median(server.ttft(CHAT_PROMPT) for _ in range(3)), 1)
    long_done = threading.Event()
    start = time.perf_counter()

    def long_prompt() -> float:
        try:
            server.complete(prompts["busy"])
            return time.perf_counter() - start
        finally:
            long_done.set()

    with ThreadPoolExecutor(1 + chats) as pool:
        long_future = pool.submit(long_prompt)
        asked = []
        for i in range(chats):  # each on its own thread: a server that holds one back holds no other
            time.sleep(max(0.0, start + chat_delay + i * chat_every - time.perf_counter()))
            if long_done.is_set():
                break
            asked.append(pool.submit(server.ttft, CHAT_PROMPT))
        ttfts = [1000 * f.result() for f in asked]
        busy_s = long_future.result()
    out["chat_busy_ttft_ms"] = [round(t, 1) for t in ttfts]
    out["chats_before_long_end"] = len(ttfts)
    out["busy_tok_s"] = round(len(prompts["busy"]) / busy_s, 1)
    return out


def run(args: argparse.Namespace, record: RunRecord) -> tuple[str, dict]:
    from bench.http_targets import SpawnedServer
    from bindings import Model
    from engine.model_source import resolve_model

    model_path = str(resolve_model(args.model))
    with Model(model_path) as model:
        def tokenize(text: str) -> list[int]:
            return model.tokenize(text, add_bos=True)

        def prompt_set(trial: int) -> dict[str, list[list[int]]]:
            seed = 1000 * trial
            return {"single": [word_stream_tokens(tokenize, n, seed + i) for i, n in enumerate(args.lengths)],
                    "parallel": [word_stream_tokens(tokenize, args.parallel_length, seed + 100 + i)
                                 for i in range(args.parallel)],
                    "busy": word_stream_tokens(tokenize, max(args.lengths), seed + 200)}

        trials_prompts = [prompt_set(t) for t in range(args.trials)]
    binary = peer_binary(args)
    results: list[dict[str, Any]] = []
    variant = SpawnedServer(args.model, args.threads, 32, args.n_ctx, args.variant.split()) if args.variant else None
    with SpawnedServer(args.model, args.threads, 32, args.n_ctx) as ours, \
            variant if variant is not None else contextlib.nullcontext():
        servers = [Server("cobatch", ours.url)]
        if variant is not None:
            servers.append(Server(f"cobatch {args.variant}", variant.url))
        peer = llama_server(binary, model_path, args.threads, args.parallel, args.n_ctx,
                            extra_args=["-fa", "on"]) if binary else None
        with peer if peer is not None else contextlib.nullcontext() as peer_url:
            if peer_url:
                servers.append(Server("llama-server", peer_url))
            for trial, prompts in enumerate(trials_prompts):
                order = servers if trial % 2 == 0 else servers[::-1]
                for server in order:
                    row = {"trial": trial, **one_trial(server, prompts, args.chat_delay, args.chats, args.chat_every)}
                    record.trial(**row)
                    results.append(row)
                    print(json.dumps(row), flush=True)
    return report(args, results, [s.name for s in servers], binary)


def report(args: argparse.Namespace, results: list[dict[str, Any]], names: list[str],
           binary: str | None) -> tuple[str, dict]:
    columns = [f"single_{n}_tok_s" for n in args.lengths] + ["parallel_tok_s"]
    labels = [f"{n:,} tokens alone" for n in args.lengths] + [f"{args.parallel} x {args.parallel_length:,} at once"]
    rows = []
    ratios: dict[str, list[float]] = {c: [] for c in columns}
    for trial in range(args.trials):
        mine = {r["server"]: r for r in results if r["trial"] == trial}
        for name in names:
            r = mine[name]
            busy, idle = r["chat_busy_ttft_ms"], r["chat_idle_ttft_ms"]
            chats = ["-", "-"]
            if busy:
                middle, worst = statistics.median(busy), max(busy)
                chats = [f"{middle:.0f} / {worst:.0f} ({len(busy)})", f"{middle / idle:.2f} / {worst / idle:.2f}"]
            alone = r[f"single_{max(args.lengths)}_tok_s"]
            rows.append([trial, name, *[r[c] for c in columns], idle, *chats, r["busy_tok_s"],
                         round(r["busy_tok_s"] / alone, 2)])
        for name in names:
            if "llama-server" not in mine or not name.startswith("cobatch"):
                continue
            ratio_row: list[object] = [trial, f"{name} / llama-server"]
            for c in columns:
                ratio = mine[name][c] / mine["llama-server"][c]
                if name == "cobatch":
                    ratios[c].append(ratio)
                ratio_row.append(round(ratio, 3))
            rows.append(ratio_row + ["", "", "", "", ""])
    longest = f"{max(args.lengths):,}"
    table = markdown_table(["trial", "server", *[f"{label} (tok/s)" for label in labels], "chat TTFT idle (ms)",
                            f"chat TTFT during a {longest}-token prefill, median / max (chats) (ms)",
                            "busy / idle, median / max", f"that {longest}-token prefill (tok/s)",
                            f"its tok/s over the {longest} alone"], rows)
    peer_note = (f"llama-server: {binary} -np {args.parallel} -kvu -fa on -c {args.n_ctx}" if binary
                 else "no llama-server (give --peer-bin)")
    summary = (f"{args.trials} trial(s), servers alternating first; every prompt distinct, max_tokens 1; "
               f"cobatch serve --n-ctx {args.n_ctx} (its defaults otherwise); {peer_note}. Chats arrive "
               f"{args.chat_delay} s after a fresh {longest}-token prompt and every {args.chat_every} s after that "
               f"until it is done (at most {args.chats}), each alone on a connection of its own.\n\n{table}")
    headline: dict[str, Any] = {}
    for c in columns:
        if ratios[c]:
            headline[f"{c}_vs_peer_median"] = round(statistics.median(ratios[c]), 3)
    ours = [r for r in results if r["server"] == "cobatch"]
    busy_over_idle = [t / r["chat_idle_ttft_ms"] for r in ours for t in r["chat_busy_ttft_ms"]]
    if busy_over_idle:
        headline["chat_busy_over_idle_ttft_median"] = round(statistics.median(busy_over_idle), 2)
        headline["chat_busy_over_idle_ttft_max"] = round(max(busy_over_idle), 2)
    headline["busy_prefill_over_alone_median"] = round(statistics.median(
        r["busy_tok_s"] / r[f"single_{max(args.lengths)}_tok_s"] for r in ours), 3)
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench long-prompt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[3000, 11000, 23000],
                        help="prompt lengths asked one at a time (comma-separated tokens)")
    parser.add_argument("--parallel", type=int, default=4, help="prompts sent at once")
    parser.add_argument("--parallel-length", type=int, default=9000, help="tokens of each of those")
    parser.add_argument("--n-ctx", type=int, default=40960, help="KV cells, for both servers")
    parser.add_argument("--chat-delay", type=float, default=1.5,
                        help="seconds into the long prefill the first chat arrives")
    parser.add_argument("--chats", type=int, default=8, help="chats sent during the long prefill, at most")
    parser.add_argument("--chat-every", type=float, default=6.0, help="seconds between those chats")
    parser.add_argument("--variant", default=None,
                        help="serve flags of a second cobatch beside the first (e.g. \"--step-token-budget 512\")")
    add_peer_arguments(parser)
    add_common_arguments(parser, trials=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.parallel, args.parallel_length, args.n_ctx, args.trials = [300, 600], 2, 200, 2048, 1
        args.chat_delay, args.chats, args.chat_every = 0.2, 2, 0.3
    record = RunRecord("long-prompt", args, args.model, argv)
    publish(record, *run(args, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
