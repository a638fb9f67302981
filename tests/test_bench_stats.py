"""The order statistics benchmarks judge their targets with."""
from __future__ import annotations

import random

import pytest

from bench.stats import median_ratio_interval, percentile


def _sample(rng: random.Random, n: int, scale: float = 1.0) -> list[float]:
    return [scale * rng.lognormvariate(0, 0.3) for _ in range(n)]


def test_percentile_interpolates_between_ranks():
    assert percentile([4, 1, 3, 2], 50) == 2.5 and percentile([], 50) != percentile([], 50)


def test_a_median_ratio_interval_holds_one_for_the_same_distribution_and_not_for_a_shifted_one():
    rng = random.Random(3)
    same = median_ratio_interval(_sample(rng, 80), _sample(rng, 160))
    shifted = median_ratio_interval(_sample(rng, 80, 1.3), _sample(rng, 160))
    assert same[1] <= 1 <= same[2]
    assert 1 < shifted[1] < 1.3 < shifted[2] and shifted[1] <= shifted[0] <= shifted[2]


def test_a_median_ratio_interval_narrows_with_more_samples_and_is_drawn_the_same_every_time():
    rng = random.Random(5)
    few, many = (_sample(rng, 20), _sample(rng, 20)), (_sample(rng, 400), _sample(rng, 400))
    width = [hi - lo for _, lo, hi in (median_ratio_interval(*few), median_ratio_interval(*many))]
    assert width[1] < width[0] / 2
    assert median_ratio_interval(*few) == median_ratio_interval(*few)
    assert all(x != x for x in median_ratio_interval([], [1.0]))  # NaNs: nothing to judge


@pytest.mark.parametrize("level", [0.5, 0.95])
def test_a_wider_level_gives_a_wider_interval(level):
    rng = random.Random(7)
    a, b = _sample(rng, 60), _sample(rng, 60)
    _, lo, hi = median_ratio_interval(a, b, level)
    _, lo99, hi99 = median_ratio_interval(a, b, 0.99)
    assert lo99 <= lo and hi <= hi99
