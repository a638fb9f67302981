"""Every benchmark runs in quick mode, so the suite cannot rot."""
import pytest

from bench.cli import BENCHMARKS, main


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_benchmark_runs_in_quick_mode(name, capsys):
    assert main([name, "--quick"]) == 0
    out = capsys.readouterr().out
    assert out.count("|") > 10  # printed a Markdown table


def test_unknown_benchmark_lists_the_names(capsys):
    assert main(["no-such-bench"]) == 2
    assert "decode-step" in capsys.readouterr().out
