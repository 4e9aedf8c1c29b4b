"""Regressions and improvements in a generated history: flagged exactly where they are."""

from __future__ import annotations

import itertools

import pytest

from polyonnx.bench.cases import Measurement
from polyonnx.bench.compare import by_machine, compare_runs, judge, machine_series
from polyonnx.bench.history import load_history
from polyonnx.bench.levels import DEFAULT, WINDOW, Z_MIN, Settings, flag
from polyonnx.bench.stats import mann_whitney_u
from tests.bench.synthetic import (
    BENCHES,
    IMPROVEMENT,
    REGRESSION,
    RUNS,
    WOBBLE,
    known_history,
    measurements,
)


def flags_of(runs, settings: Settings = DEFAULT) -> dict[tuple[str, int], list[tuple[int, str]]]:
    """(case, threads) -> [(run index, kind)] of every flagged point."""
    return {
        (s.case, s.threads): [
            (p.index, p.verdict.kind) for p in s.points if p.verdict and p.verdict.flagged
        ]
        for s in machine_series(runs, settings)
    }


def measured(median: float, data=()) -> Measurement:
    return Measurement("case", "polyonnx", 1, None, median, median, median, len(data), tuple(data))


def test_history_flags_exactly_the_regression_and_the_improvement(tmp_path):
    known_history(tmp_path)
    runs, skipped = load_history(tmp_path)
    assert len(runs) == RUNS and not skipped
    flags = flags_of(runs)
    assert set(flags) == {(b.case, b.threads) for b in BENCHES}
    expected = {key: [] for key in flags}
    expected[REGRESSION[:2]] = [(REGRESSION[2], "regression")]
    expected[IMPROVEMENT[:2]] = [(IMPROVEMENT[2], "improvement")]
    assert flags == expected
    step = next(
        p for s in machine_series(runs) if (s.case, s.threads) == REGRESSION[:2]
        for p in s.points if p.verdict and p.verdict.flagged
    )  # fmt: skip
    assert set(step.baseline_changes) == {"onnxruntime", "numpy"}
    assert all(abs(moved) < 0.01 for moved in step.baseline_changes.values())


def test_the_wobble_is_significant_but_within_the_noise(tmp_path):
    """The 3% wobble's rounds differ significantly from run to run (40 rounds of 1%
    noise: the old per-round U test flagged such runs), but it is below the threshold and
    within the spread between runs, so it is noise; even with a 2% threshold, the z-score
    keeps it unflagged."""
    known_history(tmp_path)
    runs, _ = load_history(tmp_path)
    wobble = next(s for s in machine_series(runs) if (s.case, s.threads) == WOBBLE[:2])
    verdicts = [p.verdict for p in wobble.points[WINDOW:]]
    assert 0.02 < max(abs(v.change) for v in verdicts) < 0.05
    assert all(v.kind == "noise" and abs(v.z) < Z_MIN for v in verdicts)
    data = [p.polyonnx.data for p in wobble.points]
    assert any(mann_whitney_u(a, b).p_value < 1e-6 for a, b in itertools.pairwise(data))
    assert not flags_of(runs, Settings(threshold=0.02))[WOBBLE[:2]]


def test_a_large_change_without_significance_is_noise():
    """The gate: 8% slower, but 5 rounds each spread over +-20%: the U test does not
    reject."""
    before = measured(100.0, [80, 95, 100, 105, 120])
    after = measured(108.0, [86, 102, 108, 113, 130])
    verdict = judge([before], after)
    assert verdict.change == pytest.approx(0.08)
    assert verdict.p_value > 0.3 and verdict.kind == "noise"


def test_without_per_round_data_the_quartiles_give_the_within_run_noise(tmp_path):
    known_history(tmp_path, with_data=False)
    runs, _ = load_history(tmp_path)
    assert not any(run.has_data for run in runs)
    flags = flags_of(runs)
    assert flags[REGRESSION[:2]] == [(REGRESSION[2], "regression")]
    assert flags[IMPROVEMENT[:2]] == [(IMPROVEMENT[2], "improvement")]
    assert sum(map(len, flags.values())) == 2
    verdicts = [p.verdict for s in machine_series(runs) for p in s.points if p.verdict]
    assert all(0 < v.within < 0.01 for v in verdicts)


def test_a_step_is_flagged_once_and_starts_a_new_level():
    series = measurements([1.0] * (WINDOW + 1) + [1.3] * 6, seed=3)
    kinds = [v.kind if v else None for v in flag(series)]
    assert kinds == [None] * WINDOW + ["noise", "regression", *["noise"] * 5]


def test_machines_are_never_mixed(tmp_path):
    known_history(tmp_path, other_machine=True)  # the other machine is twice slower
    runs, _ = load_history(tmp_path)
    machines = by_machine(runs)
    assert [m.node for m in machines] == ["other-box", "bench-box"]  # newest run first
    for machine, machine_runs in machines.items():
        assert len(machine_runs) == RUNS
        assert all(run.machine == machine for run in machine_runs)
        assert flags_of(machine_runs)[REGRESSION[:2]] == [(REGRESSION[2], "regression")]
        assert sum(len(v) for v in flags_of(machine_runs).values()) == 2


def test_compare_runs_judges_every_common_polyonnx_benchmark(tmp_path):
    known_history(tmp_path)
    runs, _ = load_history(tmp_path)
    changes = compare_runs(runs[0], runs[-1])
    assert [(c.case, c.threads) for c in changes] == [(b.case, b.threads) for b in BENCHES]
    kinds = {(c.case, c.threads): c.verdict.kind for c in changes}
    assert kinds.pop(REGRESSION[:2]) == "regression"
    assert kinds.pop(IMPROVEMENT[:2]) == "improvement"
    assert set(kinds.values()) == {"noise"}
    matmul = next(c for c in changes if (c.case, c.threads) == REGRESSION[:2])
    assert set(matmul.baselines) == {"onnxruntime", "numpy"}
    old, new = matmul.baselines["onnxruntime"]
    assert new / old == pytest.approx(1.0, abs=0.01)  # the baseline did not move
