"""`cobatch bench schemas`: dataset loading, the compile time limit, and the outcome of its quick
mode (no network: the samples ship in bench/schema_samples.py)."""
import json
import time

import pytest

from bench.cli import main
from bench.record import read_trials
from bench.schema_coverage import _Timeout, compile_outcome, load_dataset, timed, walk_instance
from sampling.grammar.vocab_index import index_for
from tests.test_grammar_support import VOCAB


def test_dataset_records_and_bare_schemas_with_categories(tmp_path):
    rec = {"schema": {"type": "integer"}, "tests": [{"data": 1, "valid": True}]}
    (tmp_path / "Github_easy---o1.json").write_text(json.dumps(rec))
    (tmp_path / "Github_easy---o2.json").write_text(json.dumps(rec))
    (tmp_path / "BFCL_simple_3.json").write_text(json.dumps(rec))
    sub = tmp_path / "Kubernetes"
    sub.mkdir()
    (sub / "kb_1.json").write_text(json.dumps({"type": "string"}))
    records = load_dataset(tmp_path, None, 0)
    assert sorted(r["category"] for r in records) == ["BFCL_simple", "Github_easy", "Github_easy", "Kubernetes"]
    assert [r["tests"] for r in records if r["category"] == "Kubernetes"] == [[]]
    assert len(load_dataset(tmp_path, 1, 0)) == 3


def test_time_limit_interrupts_and_is_reported():
    with pytest.raises(_Timeout):
        timed(lambda: time.sleep(2), 0.05)

    def rewraps():   # what numpy does to an exception raised inside an array comparison
        try:
            time.sleep(2)
        except _Timeout:
            raise TypeError("Cannot compare structured arrays") from None
    with pytest.raises(_Timeout):
        timed(rewraps, 0.05)

    def fails():
        raise TypeError("before the deadline")
    with pytest.raises(TypeError):
        timed(fails, 5)
    slow = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 30} for i in range(40)}}
    out = compile_outcome(slow, index_for(VOCAB), 0.01, open_objects=False)
    assert out["status"] == "timeout"


def test_outcomes_name_the_refused_keyword_and_walk_instances():
    idx = index_for(VOCAB)
    assert compile_outcome({"not": {}}, idx, 5, False) == {
        "status": "refused", "keyword": "not", "error": "unsupported keyword 'not' at /"}
    assert compile_outcome({"type": "nope"}, idx, 5, False)["status"] == "error"
    ok = compile_outcome({"type": "object", "properties": {"a": {"type": "integer"}}}, idx, 5, True)
    assert ok["status"] == "compiled" and ok["ms"] > 0
    assert walk_instance(ok["grammar"], {"a": 1, "b": [1]}) and not walk_instance(ok["grammar"], {"a": "x"})


@pytest.mark.model
def test_quick_mode_compiles_validates_and_never_accepts_an_invalid_instance(tmp_path, capsys):
    assert main(["schemas", "--quick", "--results-dir", str(tmp_path)]) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    headline = json.loads((folder / "manifest.json").read_text())["headline"]
    assert headline["schemas"] == 6 and headline["compiled"] >= 4
    assert headline["crashes"] == 0 and headline["invalid_docs"] == 0 and headline["docs"] >= 3
    assert headline["false_accepts"] == 0 and headline["false_rejects"] == 0
    trials = read_trials(folder)
    assert {t["name"] for t in trials if t["cobatch"]["status"] == "compiled"} >= {"required-undeclared", "vendor-keywords"}
