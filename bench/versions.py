"""Two versions of cobatch on the same benchmark, rounds alternating which goes first: is a change
no worse than the code before it?

    cobatch bench versions --base ../cobatch-before --rounds 3 -- decode-step --sizes 16
    cobatch bench versions --base ../cobatch-before -- http-load --spawn --concurrency 16 --no-peer

`--base` is another checkout of this repository (e.g. `git worktree add ../cobatch-before <commit>`).
Each round runs `python -m bench.cli BENCHMARK ARGS` once from the base checkout and once from this
one (each imports its own engine, and a spawned server runs its own checkout's code), storing the
child runs in a temporary folder; this run keeps each child's headline figures and summary table.
Most benchmarks carry their own same-run baseline in the headline (the raw llama_decode loop in
decode-step and http-load): compare those ratios first; a figure in absolute tok/s moves with the
machine between the two children of a round. Per headline figure: head / base within each round,
then the median over rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.record import RunRecord, add_record_arguments, publish
from bench.table import markdown_table

ROOT = Path(__file__).resolve().parent.parent


def run_child(checkout: Path, bench_args: list[str], results_dir: Path) -> dict[str, Any]:
    """One benchmark run from `checkout`: its headline and summary (read from the run it stored)."""
    before = set(results_dir.iterdir())
    command = [sys.executable, "-m", "bench.cli", *bench_args, "--results-dir", str(results_dir)]
    subprocess.run(command, cwd=checkout, check=True)
    (folder,) = set(results_dir.iterdir()) - before - {results_dir / "index.csv"}
    manifest = json.loads((folder / "manifest.json").read_text())
    return {"headline": manifest.get("headline", {}), "commit": manifest.get("git", {}).get("commit"),
            "summary": (folder / "summary.md").read_text()}


def run(args: argparse.Namespace, record: RunRecord) -> tuple[str, dict[str, Any]]:
    checkouts = {"base": Path(args.base).resolve(), "head": ROOT}
    ratios: dict[str, list[float]] = {}
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="cobatch-versions-") as tmp:
        for round_ in range(args.rounds):
            order = ["base", "head"] if round_ % 2 == 0 else ["head", "base"]
            got: dict[str, dict[str, Any]] = {}
            for name in order:
                results = Path(tmp) / f"{round_}-{name}"
                results.mkdir()
                got[name] = run_child(checkouts[name], args.bench_args, results)
                record.trial(round=round_, version=name, order=order.index(name), **got[name])
            for key, base_value in got["base"]["headline"].items():
                head_value = got["head"]["headline"].get(key)
                if not isinstance(base_value, (int, float)) or not isinstance(head_value, (int, float)):
                    continue
                ratio = head_value / base_value if base_value else None
                if ratio is not None:
                    ratios.setdefault(key, []).append(ratio)
                rows.append([round_, " then ".join(order), key, base_value, head_value,
                             "" if ratio is None else round(ratio, 3)])
    commits = {trial["version"]: trial["commit"] for trial in record.trials}
    table = markdown_table(["round", "order", "headline figure", "base", "head", "head / base"], rows)
    summary = (f"`{' '.join(args.bench_args)}` from two checkouts, {args.rounds} round(s) alternating which "
               f"runs first: base {commits.get('base')}, head {commits.get('head')}.\n\n{table}")
    headline = {f"{key}_head_over_base_median": round(statistics.median(values), 3)
                for key, values in ratios.items()}
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cobatch bench versions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="the other checkout of this repository")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="for tests: decode-step --quick against this same checkout, 2 rounds")
    add_record_arguments(parser)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER,
                        help="after --: the benchmark and its options, run in both checkouts")
    args = parser.parse_args(argv)
    if args.bench_args[:1] == ["--"]:
        args.bench_args = args.bench_args[1:]
    if args.quick:
        args.base, args.rounds = args.base or str(ROOT), 2
        args.bench_args = args.bench_args or ["decode-step", "--quick"]
    if args.base is None:
        parser.error("--base is required: the checkout to compare with")
    if not args.bench_args or args.bench_args[0] in ("versions", "plot"):
        parser.error("name a benchmark after --, e.g. -- decode-step --sizes 16")
    if "--results-dir" in args.bench_args or "--no-save" in args.bench_args:
        parser.error("the child runs are stored in a temporary folder: leave --results-dir and --no-save out")
    record = RunRecord("versions", args, None, argv)
    summary, headline = run(args, record)
    publish(record, summary, headline)
    return 0
