"""Regressions and improvements in a generated history: flagged exactly where they are."""

from __future__ import annotations

import numpy as np
import pytest

from polyonnx.bench.cases import Measurement
from polyonnx.bench.compare import by_machine, compare_runs, flag, judge, machine_series
from polyonnx.bench.history import load_history
from tests.bench.synthetic import BENCHES, IMPROVEMENT, REGRESSION, RUNS, WOBBLE, known_history


def flags_of(runs) -> dict[tuple[str, int], list[tuple[int, str]]]:
    """(case, threads) -> [(run index, kind)] of every flagged point."""
    return {
        (s.case, s.threads): [
            (p.index, p.verdict.kind) for p in s.points if p.verdict and p.verdict.flagged
        ]
        for s in machine_series(runs)
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


def test_the_wobble_is_significant_but_below_the_threshold(tmp_path):
    """What keeps the 3% wobble unflagged is the threshold: the U test alone would flag
    it (40 rounds of 1% noise)."""
    known_history(tmp_path)
    runs, _ = load_history(tmp_path)
    wobble = next(s for s in machine_series(runs) if (s.case, s.threads) == WOBBLE[:2])
    verdicts = [p.verdict for p in wobble.points[1:]]
    assert max(abs(v.change) for v in verdicts) == pytest.approx(0.03, abs=0.006)
    assert all(v.kind == "noise" for v in verdicts)
    assert any(v.p_value < 1e-6 for v in verdicts)
    lowered = flags_of_threshold(runs, 0.02)
    assert lowered[WOBBLE[:2]]  # with a 2% threshold the wobble is flagged


def flags_of_threshold(runs, threshold):
    return {
        (s.case, s.threads): [p.index for p in s.points if p.verdict and p.verdict.flagged]
        for s in machine_series(runs, threshold=threshold)
    }


def test_a_large_change_without_significance_is_noise():
    """8% slower, but 5 rounds each spread over +-20%: the U test does not reject."""
    before = measured(100.0, [80, 95, 100, 105, 120])
    after = measured(108.0, [86, 102, 108, 113, 130])
    verdict = judge([before], after)
    assert verdict.change == pytest.approx(0.08)
    assert verdict.p_value > 0.3 and verdict.kind == "noise"


def test_without_per_round_data_the_threshold_decides(tmp_path):
    known_history(tmp_path, with_data=False)
    runs, _ = load_history(tmp_path)
    assert not any(run.has_data for run in runs)
    flags = flags_of(runs)
    assert flags[REGRESSION[:2]] == [(REGRESSION[2], "regression")]
    assert flags[IMPROVEMENT[:2]] == [(IMPROVEMENT[2], "improvement")]
    series = machine_series(runs)
    assert all(p.verdict.p_value is None for s in series for p in s.points[1:])


def test_a_step_is_flagged_once_and_starts_a_new_level():
    rng = np.random.default_rng(3)
    levels = [1.0] * 4 + [1.3] * 6
    series = [measured(level, level * (1 + 0.01 * rng.standard_normal(30))) for level in levels]
    kinds = [v.kind if v else None for v in flag(series)]
    assert kinds == [None, *["noise"] * 3, "regression", *["noise"] * 5]


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
