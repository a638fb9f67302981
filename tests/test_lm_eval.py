"""lm-evaluation-harness end to end: `lm_eval --model local-completions` against a real
`cobatch serve`, on a multiple-choice (log-likelihood) task and a generation task defined in
tests/lm_eval_tasks (local data: nothing is downloaded). It uses the server's own tokenizer
through /tokenizer_info and /tokenize, so it never needs Hugging Face. Two runs on the idle
server give the same accuracy and the same log-likelihood for every choice."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server_fixtures import serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
TASKS = "cobatch_mc,cobatch_gen"


def lm_eval_executable() -> str:
    found = shutil.which("lm_eval", path=str(Path(sys.executable).parent)) or shutil.which("lm_eval")
    if found is None:
        pytest.skip("lm_eval is not installed (pip install -e .[test])")
    return found


def run_lm_eval(url: str, model: str, out: Path, home: Path) -> dict:
    """One evaluation; returns {"results": ..., "samples": {task: [sample, ...]}}."""
    offline = {"HF_HOME": str(home), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}
    # Gemma needs its BOS token and lm-eval sends token ids without one: the system instruction
    # puts it in front of every context ("<bos>" is read as the special token by /tokenize).
    done = subprocess.run(
        [lm_eval_executable(), "--model", "local-completions",
         "--model_args", f"base_url={url}/v1/completions,model={model},num_concurrent=1,max_retries=1",
         "--tasks", TASKS, "--include_path", "tests/lm_eval_tasks", "--system_instruction", "<bos>",
         "--output_path", str(out), "--log_samples"],
        cwd=ROOT, env={**os.environ, **offline}, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folder = next(out.iterdir())
    results = json.loads(next(folder.glob("results_*.json")).read_text())
    samples = {}
    for path in folder.glob("samples_*.jsonl"):
        task = path.name.split("_20")[0].removeprefix("samples_")
        samples[task] = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda s: s["doc_id"])
    return {"results": results["results"], "samples": samples}


def test_lm_eval_local_completions_runs_and_repeats(tmp_path):
    with serve_process() as (_, url):
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        first = run_lm_eval(url, model, tmp_path / "run1", tmp_path / "hf")
        second = run_lm_eval(url, model, tmp_path / "run2", tmp_path / "hf")
        assert httpx.get(f"{url}/health").json()["running"] == 0
    mc, gen = first["results"]["cobatch_mc"], first["results"]["cobatch_gen"]
    print(f"cobatch_mc acc {mc['acc,none']:.4f} acc_norm {mc['acc_norm,none']:.4f}; "
          f"cobatch_gen exact_match {gen['exact_match,none']:.4f}")
    assert len(first["samples"]["cobatch_mc"]) == 12 and len(first["samples"]["cobatch_gen"]) == 6
    for task in ("cobatch_mc", "cobatch_gen"):
        assert first["results"][task] == second["results"][task]
    # Every choice's log-likelihood, to the last bit, and every generated answer.
    choices = [[r[0][0] for r in s["resps"]] for s in first["samples"]["cobatch_mc"]]
    assert choices == [[r[0][0] for r in s["resps"]] for s in second["samples"]["cobatch_mc"]]
    assert all(float(ll) < 0 for doc in choices for ll in doc)
    answers = [s["resps"] for s in first["samples"]["cobatch_gen"]]
    assert answers == [s["resps"] for s in second["samples"]["cobatch_gen"]]
    assert all(a[0][0].strip() for a in answers)  # the model answered something each time
    assert mc["acc,none"] > 1 / 3  # better than chance on three choices: the scores mean something
