"""The Mann–Whitney U test (two-sided), with numpy only.

``mann_whitney_u(x, y)`` asks whether one sample tends to be larger than the other without
assuming any distribution, which suits timings (skewed, with a long tail of slow rounds).

- Small samples without ties get the exact p-value: the null distribution of U counted over
  every way to interleave the two samples, by the recurrence
  ``c(m, n, u) = c(m - 1, n, u - n) + c(m, n - 1, u)`` (the largest value comes from x, and
  beats all n values of y, or it comes from y).
- Larger samples, or samples with ties, get the normal approximation with the tie-corrected
  variance and a continuity correction.

Example: ``mann_whitney_u([1, 2, 3], [4, 5, 6]).p_value == 0.1`` (two of the 20 interleavings
are as extreme, one in each direction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXACT_MAX_SIZE = 30
"""The exact distribution is used while both samples have at most this many values."""


@dataclass(frozen=True)
class UTest:
    """``u``: the U statistic of x (pairs where x's value beats y's, ties count half);
    ``p_value``: two-sided; ``method``: "exact" or "normal"."""

    u: float
    p_value: float
    method: str


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    _, inverse, counts = np.unique(values[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mean_rank = ends - (counts - 1) / 2.0
    result = np.empty(len(values), dtype=float)
    result[order] = mean_rank[inverse]
    return result


def u_distribution(m: int, n: int) -> np.ndarray:
    """``counts[u]``: in how many of the C(m + n, m) interleavings of m x's and n y's the
    x's beat exactly u (x, y) pairs."""
    # table[j] holds the counts for (i, j) while i runs up to m
    table = [np.ones(1) for _ in range(n + 1)]  # i = 0: U is 0 whatever j
    for i in range(1, m + 1):
        row = [np.ones(1)]  # j = 0: U is 0
        for j in range(1, n + 1):
            counts = np.zeros(i * j + 1)
            from_x = table[j]  # (i - 1, j), shifted by j: the largest is an x beating all j
            counts[j : j + len(from_x)] += from_x
            from_y = row[j - 1]  # (i, j - 1)
            counts[: len(from_y)] += from_y
            row.append(counts)
        table = row
    return table[n]


def mann_whitney_u(x: Sequence[float], y: Sequence[float], method: str = "auto") -> UTest:
    """The two-sided Mann–Whitney U test of samples ``x`` and ``y`` (each non-empty).
    ``method``: "exact" (samples without ties only), "normal", or "auto" (exact while both
    samples have at most EXACT_MAX_SIZE values and there are no ties)."""
    if method not in ("auto", "exact", "normal"):
        raise ValueError(f"method must be auto, exact or normal, not {method!r}")
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    m, n = len(xs), len(ys)
    if m == 0 or n == 0:
        raise ValueError(f"the Mann-Whitney U test needs two non-empty samples, got {m} and {n}")
    pooled = np.concatenate([xs, ys])
    r = ranks(pooled)
    u = float(r[:m].sum() - m * (m + 1) / 2.0)
    ties = len(np.unique(pooled)) < m + n
    if method == "exact" and ties:
        raise ValueError("the exact Mann-Whitney U distribution needs samples without ties")
    small = max(m, n) <= EXACT_MAX_SIZE
    if method == "exact" or (method == "auto" and not ties and small):
        counts = u_distribution(m, n)
        total = counts.sum()
        k = round(u)
        below = counts[: k + 1].sum() / total
        above = counts[k:].sum() / total
        return UTest(u, min(1.0, 2.0 * min(below, above)), "exact")
    _, tie_counts = np.unique(pooled, return_counts=True)
    size = m + n
    tie_term = float((tie_counts**3 - tie_counts).sum()) / (size * (size - 1))
    variance = m * n / 12.0 * ((size + 1) - tie_term)
    if variance <= 0:  # every value equal: no evidence of a difference
        return UTest(u, 1.0, "normal")
    z = max(0.0, abs(u - m * n / 2.0) - 0.5) / math.sqrt(variance)
    return UTest(u, min(1.0, math.erfc(z / math.sqrt(2.0))), "normal")
