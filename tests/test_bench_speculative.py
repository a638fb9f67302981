"""`cobatch bench speculative`: its quick run against two real `cobatch serve` processes (no
llama-server), and its report's verdicts on hand-made measurements."""
import argparse

import pytest

from bench.record import read_trials
from bench.speculative import Answer, Difference, Level, differences, report
from bench.speculative_workloads import WORKLOADS

NAMES = ["auto", "off", "llama-server", "ngram-simple", "ngram-mod"]


@pytest.mark.model
@pytest.mark.slow
def test_quick_run_measures_both_modes_on_every_workload(tmp_path, capsys):
    from bench.cli import main

    assert main(["speculative", "--quick", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "auto / off" in out and "Targets missed" in out
    assert "token count differs" not in out  # cobatch's chat route renders the ids llama-server would get
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    levels = [t for t in read_trials(folder) if "workload" in t]
    seen = {(t["workload"], t["concurrency"], t["contender"]) for t in levels}
    assert seen == {(w.name, c, m) for w in WORKLOADS for c in (1, 2) for m in ("auto", "off")}
    for level in levels:
        assert level["tok_s"] > 0 and all(a["ok"] for a in level["answers"])
        if level["workload"] == "json-job":
            assert all(a["valid"] for a in level["answers"])
        else:  # ignore_eos: every request generates exactly max_tokens
            assert all(a["tokens"] == 12 for a in level["answers"])


def _level(workload, contender, tok_s, texts, trial=0, concurrency=1, valid=None, ids=None):
    answers = [Answer(f"{workload}/{i}", True, text, tokens=10, valid=valid, token_ids=None if ids is None else ids[i])
               for i, text in enumerate(texts)]
    return Level(trial, concurrency, workload, contender, wall_s=10 * len(texts) / tok_s, answers=answers)


def _args(**kw):
    defaults = dict(concurrency=[1, 16], workloads=[w.name for w in WORKLOADS], trials=1, tokens=10, threads=2,
                    n_ctx=8192, near_tie_nats=0.35, aa=False)
    return argparse.Namespace(**{**defaults, **kw})


def test_report_holds_each_workload_to_the_issue_target():
    levels = []
    speeds = {"paragraph": 1.4, "rename": 0.97, "json-job": 1.0}  # auto over off
    for workload, ratio in speeds.items():
        valid = True if workload == "json-job" else None
        levels += [_level(workload, "auto", 50 * ratio, ["a"], valid=valid), _level(workload, "off", 50, ["a"], valid=valid)]
        levels += [_level(workload, n, 60 if n == "ngram-mod" and workload == "rename" else 40, ["a"])
                   for n in NAMES[2:]]
    summary, headline = report(_args(concurrency=[1], workloads=list(speeds)), levels, [], NAMES, "llama-server", [])
    assert "C=1 paragraph: auto/off 1.40 < 1.5" in summary  # drafts must pay 1.5x here
    assert "C=1 json-job: auto/off 1.00 <= 1.0" in summary  # the job must be above off, not equal
    assert "C=1 rename: auto/ngram-mod 0.81 < 1" in summary  # and beat every llama-server mode
    assert "rename: auto/off" not in summary  # 0.97 of off is the floor where drafts miss
    assert headline["targets_missed"] == 3


def test_differing_texts_are_found_per_request_and_located():
    levels = [_level("story", "auto", 50, ["same", "the cat sat"]), _level("story", "off", 50, ["same", "the dog sat"])]
    (diff,) = differences(levels)
    assert (diff.key, diff.at_char, diff.at_token) == ("story/1", 4, None)


def test_differences_are_located_by_token_where_ids_are_given():
    # Same text, other tokens ("ab" against "a" + "b"): a difference the texts alone would miss.
    auto = _level("story", "auto", 50, ["ab", "xyz", "q"], ids=[[1, 2], [5, 6, 7], [9]])
    off = _level("story", "off", 50, ["ab", "xyz", "q"], ids=[[1, 2], [5, 8, 9], [9, 4]])
    first, second = differences([auto, off])
    assert (first.key, first.at_token, first.auto_token, first.off_token) == ("story/1", 1, 6, 8)
    assert first.at_char == 3  # the texts are equal
    assert (second.key, second.at_token, second.auto_token, second.off_token) == ("story/2", 1, None, 4)


def test_report_counts_near_ties_wider_gaps_and_unmeasured_ones():
    levels = [_level("story", "auto", 50, ["a"] * 4, ids=[[1]] * 4), _level("story", "off", 50, ["a"] * 4, ids=[[2]] * 4)]
    diffs = [Difference(f"story/{i}", 1, "story", 0, 0, 1, 2, gap) for i, gap in enumerate((0.1, -0.2, 4.6, None))]
    diffs[3].note = "the two tokens have the same text"
    summary, headline = report(_args(concurrency=[1], workloads=["story"]), levels, diffs, ["auto", "off"], None, [])
    assert "0/4" in summary and "2 near-tie(s), 1 wider, 1 unmeasured" in summary
    assert "story/2: parts at token 0 (character 0); off prefers its token there by 4.6 nats" in summary
    assert "not measured (the two tokens have the same text)" in summary
    assert headline["auto_equal_off"] == "0/4"


def test_an_a_a_run_says_so_in_its_summary_and_headline():
    levels = [_level("rename", "auto", 50, ["a"]), _level("rename", "off", 50, ["a"])]
    for aa in (False, True):
        summary, headline = report(_args(concurrency=[1], workloads=["rename"], aa=aa), levels, [], ["auto", "off"],
                                   None, [])
        assert summary.startswith("**A/A") is aa and headline.get("aa", False) is aa
