"""The dashboard's verdicts on synthetic series: steady noise is never flagged, a step is
flagged once (at the run where it happens, the new level then being the baseline), a slow
drift once it passes the threshold, and a run whose own rounds are spread wide is no
confident verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyonnx.bench.compare import machine_series
from polyonnx.bench.history import load_history
from polyonnx.bench.levels import THRESHOLD, WINDOW, Z_MIN, flag, judge_series
from tests.bench.synthetic import (
    alternating,
    drift,
    measurement_of,
    measurements,
    series_history,
    step,
    uniform,
)

RUNS = 20
AT = 10


def flags(series) -> list[tuple[int, str]]:
    return [(i, v.kind) for i, v in enumerate(flag(series)) if v and v.kind != "noise"]


@pytest.mark.parametrize("seed", range(5))
def test_alternating_noise_of_3_percent_is_never_flagged(seed):
    assert flags(measurements(alternating(RUNS), seed=seed)) == []


@pytest.mark.parametrize("seed", range(10))
def test_random_noise_within_3_percent_is_never_flagged(seed):
    assert flags(measurements(uniform(RUNS, seed=seed), seed=seed)) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.97, 1.03), min_size=1, max_size=40))
def test_no_pattern_of_3_percent_noise_is_flagged(factors):
    """Whatever the order: two runs within +-3% of a level differ by at most 6.2%, under
    the threshold."""
    assert THRESHOLD > 1.03 / 0.97 - 1
    assert all(v is None or v.kind == "noise" for v in judge_series(factors))


def test_the_issue_history_of_alternating_runs_is_not_flagged(tmp_path):
    """Issue 40: runs alternating +-3% were flagged regression, improvement, ... at every
    one of 8 runs."""
    series_history(tmp_path, {("softmax-512x1024", 1): alternating(8)})
    runs, _ = load_history(tmp_path)
    (series,) = machine_series(runs)
    verdicts = [p.verdict for p in series.points]
    assert verdicts[:WINDOW] == [None] * WINDOW
    assert [v.kind for v in verdicts[WINDOW:]] == ["noise"] * (8 - WINDOW)


@pytest.mark.parametrize("noise", ["alternating", "uniform"])
@pytest.mark.parametrize("seed", range(3))
def test_a_20_percent_step_is_flagged_once_where_it_happens(noise, seed):
    steady = alternating(RUNS) if noise == "alternating" else uniform(RUNS, seed=seed)
    verdicts = flag(measurements(step(steady, AT, 1.2), seed=seed))
    assert [(i, v.kind) for i, v in enumerate(verdicts) if v and v.flagged] == [(AT, "regression")]
    assert verdicts[AT].change == pytest.approx(0.2, abs=0.07)
    # the new level is the baseline of the runs after it
    assert all(min(v.reference) == AT for v in verdicts[AT + 1 :])
    assert all(abs(v.change) < THRESHOLD for v in verdicts[AT + 1 :])


def test_an_improvement_is_flagged_once_as_an_improvement():
    verdicts = flag(measurements(step(uniform(RUNS, seed=4), AT, 0.8), seed=4))
    assert [(i, v.kind) for i, v in enumerate(verdicts) if v and v.kind != "noise"] == [
        (AT, "improvement")
    ]
    assert verdicts[AT].change == pytest.approx(-0.2, abs=0.05) and verdicts[AT].z < -Z_MIN


def test_a_10_percent_step_is_flagged_once_where_it_happens():
    """On a machine whose runs vary by +-1%."""
    for seed in range(10):
        steady = uniform(RUNS, 0.01, seed)
        assert flags(measurements(step(steady, AT, 1.1), seed=seed)) == [(AT, "regression")]


@pytest.mark.parametrize("at", range(WINDOW, 16))
def test_a_10_percent_step_in_alternating_noise_is_flagged_once_where_it_happens(at):
    """A step on a low run is 6.7% above the level, under the threshold: the next run,
    13% above, is flagged, and the step placed at the run before it, which fits the new
    level better than the old (while the run before that fits the old)."""
    verdicts = flag(measurements(step(alternating(RUNS), at, 1.1)))
    assert [(i, v.kind) for i, v in enumerate(verdicts) if v and v.kind != "noise"] == [
        (at, "regression")
    ]
    assert all(min(v.reference) == at for v in verdicts[at + 1 :])


@pytest.mark.parametrize("seed", range(10))
def test_a_10_percent_step_in_random_3_percent_noise_is_flagged_once(seed):
    found = flags(measurements(step(uniform(RUNS, seed=seed), AT, 1.1), seed=seed))
    assert found == [(AT, "regression")]


def test_a_slow_drift_is_flagged_once_it_passes_the_threshold():
    """1% a run: flagged at the first run 7.5% above the level of the first WINDOW runs,
    and not again in 20 runs (the next flag is due 7.5% above the level the flagged run
    and the WINDOW - 1 after it set)."""
    factors = drift(RUNS, 0.01)
    level = sum(factors[:WINDOW]) / WINDOW
    first = next(i for i, f in enumerate(factors) if f / level - 1 >= THRESHOLD)
    assert flags(measurements(factors, noise=0.005)) == [(first, "regression")]
    assert factors[first] / factors[first - 1] - 1 < THRESHOLD  # no single run jumped
    verdict = flag(measurements(factors, noise=0.005))[first]
    assert verdict.reference == tuple(range(WINDOW)) and verdict.z > Z_MIN


def test_a_run_with_widely_spread_rounds_is_not_a_confident_verdict():
    """20% slower, but 5 rounds spread over +-60%: the median's own error is larger than
    the change. The same run with tight rounds is a regression."""
    steady = measurements(uniform(10, seed=1), seed=1)
    wide = measurement_of(1.2e-3 * (1 + np.array([-0.6, -0.3, 0, 0.3, 0.6])))
    assert wide.rounds == 5
    verdicts = flag([*steady, wide])
    assert verdicts[-1].kind == "noise" and verdicts[-1].change > 0.15
    assert verdicts[-1].within > 0.2
    tight = measurements([1.2], seed=1)
    assert flag([*steady, *tight])[-1].kind == "regression"


def test_short_histories_get_no_verdict():
    """The first level needs WINDOW runs: before that no run is judged, so a change within the
    first runs is not flagged (it is part of the first level)."""
    assert flag(measurements([1.0, 1.3])) == [None, None]
    verdicts = flag(measurements([1.0, 1.2, 1.2, 1.2, 1.2, 1.2]))
    assert verdicts[:WINDOW] == [None] * WINDOW
    assert all(v.kind == "noise" for v in verdicts[WINDOW:])


def test_missing_values_are_skipped():
    values = step(uniform(RUNS, seed=2), AT, 1.2)
    values[AT - 1] = None
    values[AT + 2] = math.nan
    values[3] = 0.0
    verdicts = judge_series(values)
    assert verdicts[AT - 1] is None and verdicts[AT + 2] is None and verdicts[3] is None
    assert [(i, v.kind) for i, v in enumerate(verdicts) if v and v.flagged] == [(AT, "regression")]


def test_a_benchmark_missing_from_runs_or_broken_leaves_a_gap(tmp_path):
    factors = step(uniform(12, seed=5), 8, 1.2)
    factors[5] = math.nan  # a broken record: every round NaN
    series_history(tmp_path, {("matmul-256", 1): factors, ("softmax-512x1024", 1): [1.0] * 12})
    runs, _ = load_history(tmp_path)
    matmul = next(s for s in machine_series(runs) if s.case == "matmul-256")
    assert [p.index for p in matmul.points] == [i for i in range(12) if i != 5]
    flagged = [(p.index, p.verdict.kind) for p in matmul.points if p.verdict and p.verdict.flagged]
    assert flagged == [(8, "regression")]


def test_one_slow_run_that_the_next_run_undoes_is_an_outlier():
    factors = uniform(RUNS, seed=6)
    factors[AT] *= 1.3
    verdicts = flag(measurements(factors, seed=6))
    assert [(i, v.kind) for i, v in enumerate(verdicts) if v and v.kind != "noise"] == [
        (AT, "outlier")
    ]
    assert AT not in verdicts[AT + 1].reference  # the old level goes on
    # the newest run has no next run yet: it stays flagged
    assert flag(measurements(factors[: AT + 1], seed=6))[-1].kind == "regression"
