"""`python -m bench.compact_results [RESULTS_DIR]`: brings stored runs to the storage rules of
bench/record.py: a plain trials.json becomes a capped trials.json.gz (a cap noted in the
manifest), and any other file over the cap is gzipped. Runs stored by an older writer (or on a
branch that predates it) need this once; running it again changes nothing."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from bench.record import LEGACY_TRIALS_FILE, MAX_FILE_BYTES, TRIALS_FILE, write_trials


def compact_run(folder: Path) -> list[str]:
    """Compacts one run folder; returns what it did, one line per file."""
    done = []
    legacy = folder / LEGACY_TRIALS_FILE
    if legacy.exists() and not (folder / TRIALS_FILE).exists():
        capped = write_trials(folder, json.loads(legacy.read_text()))
        legacy.unlink()
        if capped is not None:
            manifest_path = folder / "manifest.json"
            manifest = json.loads(manifest_path.read_text())
            manifest["trials_stored"] = capped
            manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
        done.append(f"{legacy} -> {TRIALS_FILE}" + (f" ({capped['kept']} of {capped['measured']} trials)"
                                                    if capped else ""))
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix != ".gz" and path.stat().st_size > MAX_FILE_BYTES:
            packed = path.with_name(path.name + ".gz")
            packed.write_bytes(gzip.compress(path.read_bytes(), compresslevel=9, mtime=0))
            path.unlink()
            done.append(f"{path} -> {packed.name}")
    return done


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0] if argv else "bench/results")
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for line in compact_run(folder):
            print(line)
    oversized = [p for p in root.rglob("*") if p.is_file() and p.stat().st_size > MAX_FILE_BYTES]
    for path in oversized:
        print(f"still over {MAX_FILE_BYTES} bytes: {path}", file=sys.stderr)
    return 1 if oversized else 0


if __name__ == "__main__":
    sys.exit(main())
