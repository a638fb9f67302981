"""Stores one benchmark run as a self-contained folder, and indexes it.

    bench/results/<UTC time>-<benchmark>/
        manifest.json   command, git commit, model file and sha256, machine, llama.cpp build
        trials.json.gz  every raw measurement, as the benchmark took it (gzip; capped, see below)
        summary.md      the Markdown table printed at the end
    bench/results/index.csv   one line per run: when, what, commit, headline figures

Runs go under ./bench/results of the directory the command runs in (the repository root), or
wherever --results-dir says; --no-save skips storing.

No stored file may exceed MAX_FILE_BYTES, so that the repository stays cheap to clone: when the
compressed trials would, the last trials are dropped until they fit, and the manifest's
"trials_stored" says how many were kept of how many. Older runs hold a plain trials.json;
read_trials takes either form.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

INDEX_FIELDS = ["run", "utc", "benchmark", "commit", "model_sha256", "headline", "folder"]
TRIALS_FILE = "trials.json.gz"
LEGACY_TRIALS_FILE = "trials.json"
MAX_FILE_BYTES = 1_000_000


def read_trials(folder: str | Path) -> list[dict[str, Any]]:
    """A stored run's trials, from trials.json.gz or (runs stored before compression) trials.json."""
    folder = Path(folder)
    packed = folder / TRIALS_FILE
    if packed.exists():
        return json.loads(gzip.decompress(packed.read_bytes()))
    return json.loads((folder / LEGACY_TRIALS_FILE).read_text())


def _pack(trials: list[dict[str, Any]]) -> bytes:
    # mtime=0: the same trials give the same bytes, so a rewrite shows no spurious diff
    return gzip.compress(json.dumps(trials, separators=(",", ":")).encode(), compresslevel=9, mtime=0)


def write_trials(folder: str | Path, trials: list[dict[str, Any]],
                 max_bytes: int = MAX_FILE_BYTES) -> dict[str, Any] | None:
    """Write trials.json.gz under max_bytes; returns None when every trial fits, else a note for
    the manifest saying how many trials were kept (the first ones) of how many."""
    blob = _pack(trials)
    kept = len(trials)
    if len(blob) > max_bytes:
        fits, too_many = 0, len(trials)   # binary search for the longest prefix that fits
        while too_many - fits > 1:
            middle = (fits + too_many) // 2
            if len(_pack(trials[:middle])) <= max_bytes:
                fits = middle
            else:
                too_many = middle
        kept, blob = fits, _pack(trials[:fits])
    (Path(folder) / TRIALS_FILE).write_bytes(blob)
    if kept == len(trials):
        return None
    return {"kept": kept, "measured": len(trials),
            "why": f"{TRIALS_FILE} is capped at {max_bytes} bytes; the trials after the first {kept} were "
                   "dropped from the file (summary.md and the headline cover all of them)"}


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", default="bench/results", help="where runs are stored")
    parser.add_argument("--no-save", action="store_true", help="print only; store nothing")


def add_common_arguments(parser: argparse.ArgumentParser, trials: int | None = None) -> None:
    """The flags every in-process benchmark shares, and the record flags; --trials only with a default."""
    if trials is not None:
        parser.add_argument("--trials", type=int, default=trials)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="GGUF path (default: the bundled model)")
    parser.add_argument("--quick", action="store_true", help="tiny settings, for tests")
    add_record_arguments(parser)


class RunRecord:
    def __init__(self, benchmark: str, args: argparse.Namespace, model_path: str | Path | None,
                 argv: list[str] | None = None) -> None:
        self.benchmark = benchmark
        self.args = args
        self.model_path = model_path
        self.command = "cobatch bench " + " ".join([benchmark, *(sys.argv[2:] if argv is None else argv)])
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.git = git_state()   # the code the run starts with, even if the checkout moves on
        self.trials: list[dict[str, Any]] = []

    def trial(self, **data: Any) -> None:
        self.trials.append({"at": round(time.time(), 3), **data})

    def save(self, summary: str, headline: dict[str, Any]) -> Path | None:
        """Write the run folder and its index line; returns the folder (None with --no-save)."""
        if getattr(self.args, "no_save", False):
            return None
        root = Path(getattr(self.args, "results_dir", "bench/results"))
        run_id = f"{self.started:%Y%m%dT%H%M%SZ}-{self.benchmark}"
        folder = root / run_id
        folder.mkdir(parents=True, exist_ok=False)
        manifest = self.manifest(headline)
        capped = write_trials(folder, self.trials)
        if capped is not None:
            manifest["trials_stored"] = capped
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (folder / "summary.md").write_text(f"# {self.benchmark}\n\n`{self.command}`\n\n{summary}\n")
        index = root / "index.csv"
        new = not index.exists()
        with index.open("a", newline="") as f:
            writer = csv.DictWriter(f, INDEX_FIELDS)
            if new:
                writer.writeheader()
            writer.writerow({
                "run": run_id, "utc": manifest["finished_utc"], "benchmark": self.benchmark,
                "commit": manifest["git"]["commit"], "model_sha256": manifest["model"]["sha256"][:16],
                "headline": "; ".join(f"{k}={_short(v)}" for k, v in headline.items()), "folder": run_id,
            })
        return folder

    def manifest(self, headline: dict[str, Any]) -> dict[str, Any]:
        from bindings.library import llama_cpp_version, system_info
        from engine.model_source import resolve_model

        model = Path(resolve_model(self.model_path))
        return {
            "benchmark": self.benchmark,
            "command": self.command,
            "arguments": {k: v for k, v in vars(self.args).items()},
            "started_utc": self.started.isoformat(timespec="seconds"),
            "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": self.git,
            "model": {"path": str(model), "bytes": model.stat().st_size, "sha256": sha256_of(model)},
            "machine": machine(),
            "llama_cpp": {"llama_cpp_python": llama_cpp_version(), "system_info": system_info().strip()},
            "python": sys.version.split()[0],
            "headline": headline,
        }


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    # Stored runs are not code: the index every run appends to must not mark the next run dirty.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return {"commit": commit or "unknown", "dirty": bool(changed)}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": affinity,
        "platform": platform.platform(),
        "memory_bytes": _memory_bytes(),
    }


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def publish_report(record: RunRecord, report: Callable[[], tuple[str, dict[str, Any]]]) -> None:
    """publish(record, *report()), except that the measured trials are stored even when the
    report fails: a long run is never lost to a bug in its summary."""
    try:
        summary, headline = report()
    except Exception as exc:
        record.save(f"The report failed ({type(exc).__name__}: {exc}); the trials are in {TRIALS_FILE}.",
                    {"report": "failed"})
        raise
    publish(record, summary, headline)


def run_trials(name: str, args: Any, argv: list[str] | None,
               one_trial: Callable[[Any, int, RunRecord], None],
               report: Callable[[RunRecord, Any], tuple[str, dict[str, Any]]]) -> RunRecord:
    """Run `args.trials` trials of benchmark `name`, each recording into one RunRecord, then
    publish its report (the trials are stored even when the report fails)."""
    record = RunRecord(name, args, args.model, argv)
    for trial in range(args.trials):
        one_trial(args, trial, record)
    publish_report(record, lambda: report(record, args))
    return record


def publish(record: RunRecord, summary: str, headline: dict[str, Any]) -> None:
    """Print the summary and store the run."""
    print(summary)
    folder = record.save(summary, headline)
    if folder is not None:
        print(f"\nstored in {folder}")
