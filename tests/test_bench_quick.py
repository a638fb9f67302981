"""Every benchmark runs in quick mode and stores its run, so the suite cannot rot."""
import csv
import json

import pytest

from bench.cli import BENCHMARKS, main
from bench.record import read_trials

pytestmark = [pytest.mark.model, pytest.mark.slow]

# cluster: run by tests/test_cluster.py, on the Ray instance those tests share.
RUNNABLE = sorted(set(BENCHMARKS) - {"plot", "cluster"})


@pytest.mark.parametrize("name", RUNNABLE)
def test_benchmark_runs_in_quick_mode_and_stores_its_run(name, capsys, tmp_path):
    assert main([name, "--quick", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("|") > 10  # printed a Markdown table
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["benchmark"] == name and manifest["command"].startswith(f"cobatch bench {name}")
    assert len(manifest["model"]["sha256"]) == 64 and manifest["machine"]["logical_cores"] >= 1
    assert len(manifest["git"]["commit"]) in (40, len("unknown"))
    assert "llama_cpp_python" in manifest["llama_cpp"]
    trials = read_trials(folder)
    assert trials and all("at" in t for t in trials)
    assert (folder / "summary.md").read_text().count("|") > 10
    (row,) = list(csv.DictReader((tmp_path / "index.csv").open()))
    assert row["benchmark"] == name and row["folder"] == folder.name and row["headline"]
    if name == "tenants":  # every rule measured in every tier, each against FIFO of the same run
        assert {(t["rule"], t["tier"], t["scenario"]) for t in trials} == {
            (rule, tier, scenario) for tier in ("batch", "interactive")
            for rule, scenarios in (("fifo", ("backlogged", "light")), ("fair 1:1", ("backlogged", "light")),
                                    ("fair 3:1", ("backlogged",)),
                                    ("quota", ("within", "hammering", "within again")))
            for scenario in scenarios}
        assert all(t["tok_s"] > 0 and sum(t["requests"].values()) > 0 for t in trials)
        hammered = [t for t in trials if t["scenario"] == "hammering"]
        assert all(t["failures"]["a"] > 0 and t["failures"]["b"] == 0 for t in hammered)  # A's 429s, B untouched
        # The hammered window is judged against the noise of the two windows around it, per tier.
        assert len(manifest["headline"]["within_noise"]) == 2
        assert isinstance(manifest["headline"]["hammered_within_noise"], bool)
        # B streams beside the quota: its time to first token is timed and judged the same way.
        assert all(0 < t["median_ttft_s"]["b"] < t["median_latency_s"]["b"] for t in trials if t["rule"] == "quota")
        assert len(manifest["headline"]["within_ttft_noise"]) == 2
        assert isinstance(manifest["headline"]["hammered_ttft_within_noise"], bool)
        # ... and on every answer of B's per tier, pooled over trials, with its interval.
        pooled = manifest["headline"]["hammered_b_ttft_pooled"]
        assert set(pooled) == {"batch", "interactive"} and all(lo <= r <= hi for r, lo, hi in pooled.values())
        assert all(len(t["ttft_samples_s"]["b"]) == t["requests"]["b"] for t in trials if t["rule"] == "quota")
    if name == "draft-price":  # every case timed in every round; the headline is the trials' medians
        import statistics
        from bench.draft_price import break_even
        drafted = [t for t in trials if "forced_rows" not in t and "step_draft_rows" not in t]
        assert {(t["streams"], t["draft_rows"], t["round"]) for t in drafted} == {
            (s, k, r) for s in (1, 2) for k in (0, 2) for r in (0, 1)}
        median = {(s, k): statistics.median(t["seconds"] for t in drafted if (t["streams"], t["draft_rows"]) == (s, k))
                  for s in (1, 2) for k in (0, 2)}
        for s in (1, 2):
            assert manifest["headline"][f"break_even_s{s}_k2"] == round(break_even(median[s, 0], median[s, 2], 2), 3)
        assert median[2, 2] > median[2, 0]  # six rows with logits against two
        # Forced rows (no logits) per sequence, timed in the same rounds: priced like draft rows.
        forced = [t for t in trials if "forced_rows" in t]
        assert {(t["streams"], t["forced_rows"], t["round"]) for t in forced} == {
            (s, 1, r) for s in (1, 2) for r in (0, 1)}
        for s in (1, 2):
            t_forced = statistics.median(t["seconds"] for t in forced if t["streams"] == s)
            assert manifest["headline"][f"forced_row_ms_s{s}_k1"] == round((t_forced - median[s, 0]) * 1000 / s, 2)
            assert t_forced < median[s, 2]  # two rows without the vocabulary's projection against four with it
        # One draft row in the whole step, on the first sequence.
        stepped = [t for t in trials if "step_draft_rows" in t]
        assert {(t["streams"], t["step_draft_rows"], t["round"]) for t in stepped} == {
            (s, 1, r) for s in (1, 2) for r in (0, 1)}
        for s in (1, 2):
            t_step = statistics.median(t["seconds"] for t in stepped if t["streams"] == s)
            assert manifest["headline"][f"step_rows_added_ms_s{s}_k1"] == round((t_step - median[s, 0]) * 1000, 2)
    if name == "invariance":  # the drafted step's shape measured with both kernels, and counted in the tolerance
        for t in trials:
            (drift,) = t["draft_rows_drift"].values()  # 4 sequences with 2 draft rows each: 12 rows
            assert list(t["draft_rows_drift"]) == ["12"] and 0 <= drift["top2_gap"] <= 2 * drift["top2_logprob"] + 1e-9
            fa = "fa_on" if t["flash_attn"] else "fa_off"
            assert manifest["headline"][f"near_tie_nats_{fa}"] >= round(2 * drift["top2_logprob"], 3)
            # ... and the step where a new request's prompt chunk rides with them: 4 rows and 32 prompt tokens
            (beside,) = t["prompt_chunk_drift"].values()
            assert list(t["prompt_chunk_drift"]) == ["4+32"] and 0 <= beside["top2_gap"] <= 2 * beside["top2_logprob"] + 1e-9
            assert manifest["headline"][f"near_tie_nats_{fa}"] >= round(2 * beside["top2_logprob"], 3)
            assert manifest["headline"][f"prompt_chunk_gap_move_{fa}"] == round(beside["top2_gap"], 3)
            # arrivals: the same prompts at once and staggered, compared up to where they part
            assert 0 <= t["arrivals_same"] <= t["requests"] and t["arrivals_max_diff"] >= 0
            assert manifest["headline"][f"near_tie_nats_{fa}"] >= round(2 * t["arrivals_max_diff"], 3)
    if name in PLOTTABLE:
        pytest.importorskip("matplotlib")
        assert main(["plot", str(folder)]) == 0
        assert list(folder.glob("*.png"))


PLOTTABLE = {"sequential", "mixed-priority", "http-load"}


@pytest.mark.parametrize("name,options", [
    # cobatch serve processes (one with another interactive batch-row bound), a busy neighbour
    ("mixed-priority", ["--http", "--neighbour", "nice19", "--interactive-batch-rows", "2"]),
    ("shared-cpu", ["--neighbour", "nice19"]),  # the raw loop measured beside the servers
    ("http-load", ["--spawn", "--neighbour", "nice19", "--no-raw-loop"]),
    ("http-load", ["--page-view", "--no-raw-loop"]),  # each level also with the page's event stream read
])
def test_benchmark_options_run_in_quick_mode(name, options, capsys, tmp_path):
    assert main([name, *options, "--quick", "--results-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("|") > 10
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    trials = read_trials(folder)
    assert trials and json.loads((folder / "manifest.json").read_text())["benchmark"] == name
    if "--http" in options:
        assert {t["server"] for t in trials} == {"priority", "priority rows=2", "fifo"}
        assert all(t["neighbour"] == "nice19" and t["batch_tok_s"] > 0 for t in trials)
    if "--page-view" in options:
        systems = [t["system"] for t in trials]
        assert systems.count("cobatch_page_open") == systems.count("cobatch") > 0
    if name == "shared-cpu":
        servers = {t["server"] for t in trials}
        assert {"governor", "fixed", "raw loop", "raw loop, 1 thread"} <= servers
        assert all(t["tok_s"] > 0 for t in trials)


def test_no_save_stores_nothing(tmp_path, capsys):
    assert main(["decode-step", "--quick", "--no-save", "--results-dir", str(tmp_path)]) == 0
    assert not list(tmp_path.iterdir())


def test_unknown_benchmark_lists_the_names(capsys):
    assert main(["no-such-bench"]) == 2
    assert "decode-step" in capsys.readouterr().out


def test_mixed_http_report_survives_a_peer_that_finished_nothing():
    from bench.mixed_http import report

    def row(server, tok_s, collapsed=False):
        return {"trial": 0, "neighbour": "nice19-session", "server": server, "batch_tok_s": tok_s,
                "idle_ttft_p50": 50.0, "ttft_p95": 100.0, "idle_e2e_p50": 600.0, "e2e_p95": 1500.0,
                "collapsed": collapsed, "batch_done": 0 if collapsed else 24, "makespan_s": 240.0}

    summary, headline = report([row("priority", 48.0), row("fifo", 60.0), row("llama-server", 0.0, True)],
                               ["nice19-session"])
    assert "llama-server's flood collapsed: 0 of its requests done in 240 s" in summary
    assert "flood 0.80x FIFO's" in summary and headline["trials_met_nice19-session"] == "0/1"


def test_break_even_acceptance_is_what_each_draft_row_must_add():
    from bench.draft_price import break_even
    # A plain step of 100 ms; with 2 draft rows per sequence 150 ms: each row must add a quarter token.
    assert break_even(0.100, 0.150, 2) == pytest.approx(0.25)
    assert break_even(0.100, 0.300, 1) == pytest.approx(2.0)  # more than one token: no draft can pay
