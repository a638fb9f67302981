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
