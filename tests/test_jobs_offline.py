"""`cobatch batch INPUT -o OUTPUT`: the batch line format run in process, resumable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.jobs.offline import finished_ids

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[1]


def _write_input(path: Path, n: int) -> None:
    lines = []
    for i in range(n):
        url = "/v1/completions" if i % 2 else "/v1/chat/completions"
        body = {"max_tokens": 12, "temperature": 0}
        if url == "/v1/completions":
            body["prompt"] = f"Count to {i}:"
        else:
            body["messages"] = [{"role": "user", "content": f"Say {i}."}]
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body})
    lines.append({"custom_id": "refused", "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": "x", "max_tokens": 0}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _batch(input_path: Path, output: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", "batch", str(input_path), "-o", str(output), "--n-ctx", "2048",
         "--max-batch", "4", "--step-token-budget", "64"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # A runner that started the tests in the background hands its children SIGINT ignored,
        # and the interrupt this test sends would then do nothing.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_an_interrupted_run_resumes_and_each_request_is_answered_once(tmp_path):
    n = 24
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, n)
    first = _batch(source, output)
    deadline = time.monotonic() + 300
    while not output.exists() or output.read_text().count("\n") < 4:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130 and "rerun the same command to resume" in err
    done_first = finished_ids(output)
    assert 4 <= len(done_first) < n + 1

    second = _batch(source, output)
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    assert f"resuming: {len(done_first)} of {n + 1}" in err and f"{n + 1}/{n + 1} (100%)" in err
    lines = [json.loads(x) for x in output.read_text().splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted([f"r{i}" for i in range(n)] + ["refused"])
    assert len({x["id"] for x in lines}) == len(lines)  # ids do not repeat across the resume
    by_id = {x["custom_id"]: x for x in lines}
    assert by_id["refused"]["response"]["status_code"] == 400
    assert by_id["r0"]["response"]["body"]["object"] == "chat.completion"
    assert by_id["r1"]["response"]["body"]["object"] == "text_completion"
    assert all(by_id[f"r{i}"]["response"]["status_code"] == 200 for i in range(n))


def test_an_input_with_bad_lines_is_refused_before_any_work(tmp_path):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\nnot json\n')
    proc = _batch(source, output)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "line 1" in err and "line 2" in err and not output.exists()


def test_a_second_run_on_the_same_output_is_refused_and_writes_nothing(tmp_path):
    import fcntl
    import io

    from server.jobs.offline import run_offline

    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source, 2)
    output.write_text('{"custom_id": "r0", "response": null}\n')
    with open(output, "ab") as running:  # what the first run holds while it writes
        fcntl.flock(running.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        said = io.StringIO()
        assert run_offline(source, output, app=None, in_flight=1, progress=said) == 2
        assert "another `cobatch batch`" in said.getvalue()
    assert output.read_text() == '{"custom_id": "r0", "response": null}\n'


def test_a_line_cut_short_by_a_kill_is_dropped_and_run_again(tmp_path):
    output = tmp_path / "out.jsonl"
    output.write_text('{"custom_id": "a", "response": null}\n{"custom_id": "b", "resp')
    assert finished_ids(output) == {"a"}
    assert output.read_text() == '{"custom_id": "a", "response": null}\n'
