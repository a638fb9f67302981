"""Stored benchmark runs stay cheap to clone, and the compressed trials read back as written."""
import gzip
import json
import subprocess
from pathlib import Path

import pytest

from bench.compact_results import compact_run
from bench.record import LEGACY_TRIALS_FILE, MAX_FILE_BYTES, TRIALS_FILE, read_trials, write_trials

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
MAX_TOTAL_BYTES = 15 * 1024 * 1024


def test_results_stay_under_the_stated_size():
    used_kib = int(subprocess.run(["du", "-sk", str(RESULTS)], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
    assert used_kib * 1024 < MAX_TOTAL_BYTES, f"du says bench/results holds {used_kib} KiB"


def test_no_stored_file_exceeds_the_cap():
    too_big = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*")
               if p.is_file() and p.stat().st_size > MAX_FILE_BYTES]
    assert not too_big, f"over {MAX_FILE_BYTES} bytes (run python -m bench.compact_results): {too_big}"


def test_every_stored_run_has_compressed_trials_that_read_back():
    runs = [p for p in RESULTS.iterdir() if (p / "manifest.json").exists()]
    assert runs
    for run in runs:
        assert (run / TRIALS_FILE).exists() and not (run / LEGACY_TRIALS_FILE).exists(), run.name
        assert isinstance(read_trials(run), list), run.name


def _trials(n):
    # unique text per trial, so gzip cannot squeeze them below the cap
    return [{"at": i, "text": f"{i:08d}" + "".join(chr(0x4e00 + (i * 7919 + k) % 20000) for k in range(40))}
            for i in range(n)]


def test_trials_under_the_cap_are_kept_whole(tmp_path):
    trials = _trials(50)
    assert write_trials(tmp_path, trials) is None
    assert read_trials(tmp_path) == trials


def test_trials_over_the_cap_keep_the_longest_prefix_that_fits_and_say_so(tmp_path):
    trials = _trials(3000)
    note = write_trials(tmp_path, trials, max_bytes=20_000)
    stored = read_trials(tmp_path)
    assert (tmp_path / TRIALS_FILE).stat().st_size <= 20_000
    assert note["measured"] == 3000 and 0 < note["kept"] == len(stored) < 3000
    assert stored == trials[:note["kept"]] and str(note["kept"]) in note["why"]
    # one more trial would not have fitted
    assert len(gzip.compress(json.dumps(trials[:note["kept"] + 1], separators=(",", ":")).encode(), 9)) > 20_000


def test_a_plain_trials_json_reads_and_compacts_once(tmp_path):
    trials = _trials(5)
    (tmp_path / "manifest.json").write_text(json.dumps({"benchmark": "x"}))
    (tmp_path / LEGACY_TRIALS_FILE).write_text(json.dumps(trials, indent=1))
    assert read_trials(tmp_path) == trials
    assert compact_run(tmp_path) and compact_run(tmp_path) == []
    assert not (tmp_path / LEGACY_TRIALS_FILE).exists() and read_trials(tmp_path) == trials
    assert "trials_stored" not in json.loads((tmp_path / "manifest.json").read_text())


def test_a_stored_run_still_plots(tmp_path):
    pytest.importorskip("matplotlib")
    import shutil

    from bench.plots import main

    run = next(p for p in sorted(RESULTS.iterdir()) if p.name.endswith("-sequential"))
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    assert main([str(copy)]) == 0 and (copy / "sequential.png").exists()
