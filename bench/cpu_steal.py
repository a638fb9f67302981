"""CPU time the hypervisor took from this virtual machine (the `steal` column of /proc/stat).

On this machine the same llama_decode step sometimes takes ten times as long as a moment
before; steal time shows whether the machine, not the code under test, was slow during a run.
"""
from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
STEAL_COLUMN = 7  # user nice system idle iowait irq softirq steal ...


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) ticks over all CPUs since boot; None where /proc/stat is missing."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields[:8]]  # guest time is already counted in user
    return values[STEAL_COLUMN], sum(values)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The fraction of CPU time stolen between two readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])
