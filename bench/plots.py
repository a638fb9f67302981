"""`cobatch bench plot RUN_FOLDER`: draws a stored run's figures as PNG files in the run folder.

- sequential:      tok/s and p95 latency against concurrency, cobatch vs one-at-a-time Llama,
                   with the raw-loop and llama-batched-bench ceilings when measured
- http-load:       tok/s and p95 latency against concurrency, cobatch vs the peer server,
                   with the raw-loop ceiling
- mixed-priority:  interactive TTFT p50/p95/p99 on the idle engine, under the flood with
                   priority, and under the flood with FIFO

Needs matplotlib (pip install 'cobatch[bench]').
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.record import read_trials
from bench.stats import percentile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cobatch bench plot", description=__doc__)
    parser.add_argument("run", help="a folder under bench/results")
    args = parser.parse_args(argv)
    folder = Path(args.run)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        trials = read_trials(folder)
    except (OSError, ValueError) as exc:
        print(f"plot: {folder} is not a stored run: {exc}", file=sys.stderr)
        return 2
    try:
        import matplotlib
    except ImportError:
        print("plot: needs matplotlib: pip install 'cobatch[bench]'", file=sys.stderr)
        return 1
    matplotlib.use("Agg")
    drawers = {"sequential": plot_sequential, "http-load": plot_http_load, "mixed-priority": plot_mixed}
    drawer = drawers.get(manifest["benchmark"])
    if drawer is None:
        print(f"plot: nothing to draw for {manifest['benchmark']}", file=sys.stderr)
        return 2
    out = folder / f"{manifest['benchmark']}.png"
    drawer(trials, manifest, out)
    print(f"wrote {out}")
    return 0


def _caption(manifest: dict[str, Any]) -> str:
    return f"{manifest['finished_utc'][:10]}, commit {manifest['git']['commit'][:7]}, {manifest['machine']['cpu']}"


def _two_panels(title: str, manifest: dict[str, Any]):
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    fig.suptitle(f"{title}\n{_caption(manifest)}", fontsize=10)
    left.set_xlabel("concurrency")
    left.set_ylabel("generated tok/s")
    right.set_xlabel("concurrency")
    right.set_ylabel("p95 request latency (s)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    return fig, left, right


def plot_sequential(trials: list[dict], manifest: dict[str, Any], out: Path) -> None:
    from bench.sequential import queued_latencies

    seq = [t for t in trials if t["system"] == "sequential"]
    by_level: dict[int, list[dict]] = defaultdict(list)
    for t in trials:
        if t["system"] == "cobatch":
            by_level[t["concurrency"]].append(t)
    levels = sorted(by_level)
    med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    fig, left, right = _two_panels("Sequential llama-cpp-python vs cobatch continuous batching", manifest)
    left.plot(levels, [med(by_level[c], "tok_s") for c in levels], "o-", label="cobatch")
    left.plot(levels, [med(seq, "tok_s")] * len(levels), "s--", label="Llama.create_completion, one at a time")
    raw: dict[int, list[float]] = defaultdict(list)
    for t in trials:
        if t["system"] == "raw_loop":
            raw[t["batch"]].append(t["tok_s"])
    if raw:
        left.plot(sorted(raw), [statistics.median(raw[b]) for b in sorted(raw)], ":",
                  label="raw llama_decode loop (B = C)")
    for t in trials:
        if t["system"] == "llama-batched-bench":
            tg = {int(b): v for b, v in t["s_tg"].items()}
            left.plot(sorted(tg), [tg[b] for b in sorted(tg)], "^:", label="llama-batched-bench S_TG")
    right.plot(levels, [med(by_level[c], "latency_p95") for c in levels], "o-", label="cobatch")
    right.plot(levels, [percentile(queued_latencies(seq[0]["service_s"], c), 95) for c in levels], "s--",
               label="one at a time (measured service times, queued)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_http_load(trials: list[dict], manifest: dict[str, Any], out: Path) -> None:
    fig, left, right = _two_panels("HTTP load: cobatch vs llama-server, same workload, same run", manifest)
    tok_s: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    latencies: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        c = t["concurrency"]
        if t["system"] == "raw_loop":
            tok_s["raw_loop"][c].append(t["tok_s"])
            continue
        ok = [s for s in t["samples"] if s["ok"]]
        tok_s[t["system"]][c].append(sum(s["tokens"] for s in ok) / t["wall_s"])
        latencies[t["system"]][c] += [s["latency_s"] for s in ok]
    for side, label, style in (("cobatch", "cobatch serve", "o-"), ("peer", "llama-server", "o-"),
                               ("raw_loop", "raw llama_decode loop (B = C)", ":")):
        if side not in tok_s:
            continue
        xs = sorted(tok_s[side])
        left.plot(xs, [statistics.median(tok_s[side][c]) for c in xs], style, label=label)
        if side in latencies:
            right.plot(xs, [percentile(latencies[side][c], 95) for c in xs], style, label=label)
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_mixed(trials: list[dict], manifest: dict[str, Any], out: Path) -> None:
    import matplotlib.pyplot as plt

    modes = [("idle", "idle engine"), ("priority", "flood, priority"), ("fifo", "flood, FIFO")]
    stats = ("ttft_p50", "ttft_p95", "ttft_p99")
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.26
    for i, (mode, label) in enumerate(modes):
        runs = [t for t in trials if t["mode"] == mode]
        values = [statistics.median(r[s] for r in runs) / 1000 for s in stats]
        ax.bar([k + (i - 1) * width for k in range(len(stats))], values, width, label=label)
    ax.set_xticks(range(len(stats)), ["TTFT p50", "TTFT p95", "TTFT p99"])
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, axis="y")
    args = manifest["arguments"]
    ax.set_title(f"Interactive TTFT during a batch flood ({args['batch']} x {args['batch_tokens']} tokens, "
                 f"interactive every {args['every']} s)\n{_caption(manifest)}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
