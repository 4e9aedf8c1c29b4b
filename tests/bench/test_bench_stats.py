"""The Mann–Whitney U test against brute-force enumeration of every interleaving."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyonnx.bench.stats import mann_whitney_u, ranks, u_distribution


def u_of(x, y) -> float:
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def brute_force_p(x, y) -> float:
    """Two-sided exact p: the share of all splits of the pooled values into samples of
    len(x) and len(y) whose U is at least as far from its mean as the observed one."""
    pooled = list(x) + list(y)
    m, n = len(x), len(y)
    centre = m * n / 2
    observed = abs(u_of(x, y) - centre)
    extreme = total = 0
    for chosen in itertools.combinations(range(m + n), m):
        xs = [pooled[i] for i in chosen]
        ys = [pooled[i] for i in range(m + n) if i not in chosen]
        total += 1
        extreme += abs(u_of(xs, ys) - centre) >= observed - 1e-9
    return extreme / total


def test_separated_samples_of_three():
    result = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert result.u == 0 and result.method == "exact"
    assert result.p_value == pytest.approx(0.1)  # 2 of the 20 splits are as extreme


def test_u_distribution_counts_every_interleaving():
    for m, n in [(1, 1), (2, 3), (4, 4), (5, 2)]:
        counts = u_distribution(m, n)
        assert counts.sum() == math.comb(m + n, m)
        assert len(counts) == m * n + 1
        np.testing.assert_array_equal(counts, counts[::-1])  # symmetric around mn/2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=6, unique=True),
    st.integers(1, 5),
    st.randoms(use_true_random=False),
)
def test_exact_p_matches_brute_force(values, m, rnd):
    if len(values) < 2:
        return
    m = min(m, len(values) - 1)
    rnd.shuffle(values)
    x, y = values[:m], values[m:]
    result = mann_whitney_u(x, y)
    assert result.method == "exact"
    assert result.u == u_of(x, y)
    assert result.p_value == pytest.approx(brute_force_p(x, y))


def test_normal_approximation_is_close_to_exact_for_larger_samples():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(25)
    y = rng.standard_normal(28) + 0.5
    exact = mann_whitney_u(x, y)
    assert exact.method == "exact"
    approx = mann_whitney_u(x, y, method="normal")
    assert approx.method == "normal" and approx.u == exact.u
    assert approx.p_value == pytest.approx(exact.p_value, rel=0.02)
    with pytest.raises(ValueError, match="without ties"):
        mann_whitney_u([1, 2], [2, 3], method="exact")


def test_ties_share_their_mean_rank():
    np.testing.assert_array_equal(ranks(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1, 3.5, 2])
    result = mann_whitney_u([1, 2, 2, 3], [2, 3, 3, 4])
    assert result.method == "normal"
    assert result.u == u_of([1, 2, 2, 3], [2, 3, 3, 4])
    assert 0 < result.p_value < 1


def test_identical_samples_are_no_evidence():
    assert mann_whitney_u([5.0] * 10, [5.0] * 12).p_value == 1.0


def test_large_shifted_samples_are_significant_and_equal_ones_are_not():
    rng = np.random.default_rng(0)
    base = 1e-3 * (1 + 0.01 * rng.standard_normal(200))
    slower = 1.03e-3 * (1 + 0.01 * rng.standard_normal(200))
    same = 1e-3 * (1 + 0.01 * rng.standard_normal(200))
    assert mann_whitney_u(slower, base).p_value < 1e-10
    assert mann_whitney_u(same, base).p_value > 0.01


def test_empty_sample_is_an_error():
    with pytest.raises(ValueError, match="non-empty"):
        mann_whitney_u([], [1.0])
