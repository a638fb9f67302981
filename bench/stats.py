"""Order statistics for benchmark samples."""
from __future__ import annotations


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median_ratio_interval(numerator: list[float], denominator: list[float], level: float = 0.95,
                          resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """median(numerator) / median(denominator) and its bootstrap percentile interval at `level`:
    both samples resampled with replacement, each on its own. Seeded, so a stored run's report
    is the same every time it is drawn. NaNs for an empty sample."""
    import numpy as np

    if not numerator or not denominator:
        return float("nan"), float("nan"), float("nan")
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    rng = np.random.default_rng(seed)
    ratios = (np.median(rng.choice(a, (resamples, a.size)), axis=1)
              / np.median(rng.choice(b, (resamples, b.size)), axis=1))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(np.median(a) / np.median(b)), float(low), float(high)
