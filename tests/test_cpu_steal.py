"""The machine-noise gauge the mixed-priority benchmark prints beside each flood."""
from bench import cpu_steal
from bench.cpu_steal import cpu_ticks, steal_share


def test_steal_share_is_stolen_ticks_over_all_ticks_between_readings():
    assert steal_share((100, 1000), (130, 1200)) == 30 / 200
    assert steal_share(None, (130, 1200)) is None
    assert steal_share((100, 1000), (100, 1000)) is None  # no time passed: nothing to divide


def test_reads_the_steal_column_of_proc_stat(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 1 5 80 2 0 1 7 3 0\ncpu0 5 0 2 40 1 0 0 3 0 0\n")
    monkeypatch.setattr(cpu_steal, "PROC_STAT", stat)
    assert cpu_ticks() == (7, 10 + 1 + 5 + 80 + 2 + 0 + 1 + 7)  # guest (3) is inside user already
    monkeypatch.setattr(cpu_steal, "PROC_STAT", tmp_path / "missing")
    assert cpu_ticks() is None
