"""The model-level A/B's verdict on synthetic timings: noise alone drops the records, a
real speed-up keeps them (even on a machine whose speed swings between rounds), a
slowdown drops them; and the subsets tried when the whole set is not faster."""

from __future__ import annotations

import re

import numpy as np
import pytest

from polyonnx.tune.cli import verdict_line
from polyonnx.tune.evaluate import Outcome
from polyonnx.tune.session import Result
from polyonnx.tune.verdict import (
    MIN_ROUNDS,
    Decision,
    Estimate,
    Record,
    decide,
    estimate,
    paired_rounds,
    subsets,
)

MS = 1e-3


def machine(seed: int, noise: float = 0.03, swing: float = 0.0):
    """Synthetic timers for one default and one tuned model on a machine whose runs
    vary by ``noise`` (each block on its own) and whose speed swings by ``swing`` from
    one round to the next (both models of a round alike)."""
    rng = np.random.default_rng(seed)
    state = {"level": 1.0, "turns": 0}

    def timer(seconds: float):
        def block() -> float:
            if state["turns"] % 2 == 0:  # a new round: the machine's speed moves
                state["level"] = 1.0 + swing * rng.uniform(-1, 1)
            state["turns"] += 1
            return seconds * state["level"] * float(rng.lognormal(0.0, noise))

        return block

    return timer


def ab(tuned_over_default: float, seed: int = 0, **machine_kw) -> Estimate:
    timer = machine(seed, **machine_kw)
    return paired_rounds(timer(1 * MS), timer(tuned_over_default * MS), 1.0, clock=lambda: 0.0)


def one_record(estimate_: Estimate) -> Decision:
    return decide([Record("t", "mm1", 0.5)], lambda tasks: estimate_, lambda: True)


def test_noise_alone_drops_the_record():
    # at 95% confidence, noise alone reads as a gain now and then: rarely, never often
    seeds = range(40)
    decisions = [one_record(ab(1.0, seed)) for seed in seeds]
    kept = [d for d in decisions if d.kept]
    assert len(kept) <= 0.1 * len(decisions)
    dropped = [d for d in decisions if not d.kept]
    assert all(d.final is None for d in dropped)
    assert all("not faster beyond the noise" in d.reasons["t"] for d in dropped)
    typical = [d.attempts[0].estimate for d in dropped]
    assert sum(e.low <= 1.0 <= e.high for e in typical) >= 0.9 * len(decisions)


@pytest.mark.parametrize("seed", range(5))
def test_a_real_speedup_is_kept_even_when_the_machine_swings(seed):
    # a 5% gain under a machine speed that swings by ±30% between rounds: the pairing
    # within a round cancels the swing
    result = ab(1 / 1.05, seed, swing=0.3)
    assert result.faster and 1.02 < result.ratio < 1.08
    decision = one_record(result)
    assert decision.kept == ("t",) and decision.final == result and not decision.reasons


@pytest.mark.parametrize("seed", range(5))
def test_a_slowdown_is_dropped(seed):
    result = ab(1.1, seed)
    assert result.high < 1.0 and not result.faster
    assert one_record(result).kept == ()


def test_a_clear_verdict_stops_early_and_noise_runs_longer():
    clear = ab(0.5)
    assert clear.rounds == MIN_ROUNDS  # settled at its first look
    assert ab(1.0, noise=0.2).rounds > MIN_ROUNDS


def test_estimate_is_the_median_ratio_with_an_interval_around_it():
    default = [1.0, 1.1, 0.9, 1.0, 1.2, 1.0]
    tuned = [0.5, 0.55, 0.45, 0.5, 0.6, 0.5]
    result = estimate(default, tuned)
    assert result.ratio == pytest.approx(2.0) and result.low == pytest.approx(2.0)
    assert result.rounds == 6 and result.default_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive timings"):
        estimate([1.0], [0.0])
    with pytest.raises(ValueError, match="non-empty"):
        estimate([], [])


def test_subsets_drop_the_least_expected_gain_first():
    records = [
        Record(name, name, gain) for name, gain in zip("abcde", [3, 5, 1, 4, 2], strict=True)
    ]
    assert subsets(records) == [
        ("b", "d", "a", "e", "c"), ("b", "d", "a", "e"), ("b", "d", "a"), ("b",),
    ]  # fmt: skip
    assert subsets(records[:1]) == [("a",)]
    assert subsets(records[:2]) == [("b", "a"), ("b",)]


def _fixed(ratio: float) -> Estimate:
    spread = 0.01
    return Estimate(ratio, ratio - spread, ratio + spread, 40, 1e-3, 1e-3 / ratio)


def test_when_the_whole_set_is_slower_a_faster_subset_is_kept():
    records = [Record("a", "mm1", 0.3), Record("b", "conv", 0.2), Record("c", "relu", 0.1)]
    measured = {("a", "b", "c"): _fixed(0.97), ("a", "b"): _fixed(0.99), ("a",): _fixed(1.05)}
    tried = []

    def measure(tasks):
        tried.append(tasks)
        return measured[tasks]

    decision = decide(records, measure, lambda: True)
    assert tried == [("a", "b", "c"), ("a", "b"), ("a",)]
    assert decision.kept == ("a",) and decision.final == measured[("a",)]
    assert set(decision.reasons) == {"b", "c"}
    assert "0.99×" in decision.reasons["b"] and "0.97×" in decision.reasons["c"]


def test_no_time_left_tries_the_whole_set_only():
    records = [Record("a", "mm1", 0.3), Record("b", "conv", 0.2)]
    decision = decide(records, lambda tasks: _fixed(0.98), lambda: False)
    assert [a.tasks for a in decision.attempts] == [("a", "b")]
    assert decision.kept == () and set(decision.reasons) == {"a", "b"}


def test_an_interval_that_holds_one_never_prints_as_above_it():
    text = Estimate(1.03, 0.9991, 1.07, 137, 1e-3, 1e-3).text()
    assert text == "1.03× (95% CI 0.999–1.07, 137 rounds)"


LAST_LINE = re.compile(
    r"tuned model: (\d+\.\d\d)× the default "
    r"\((95% CI (\d+\.\d+)–(\d+\.\d+), (\d+) rounds|the default is kept: no tuned records in use)\)"
)


def _result(decision: Decision | None) -> Result:
    result = Result("m.onnx", "t.db", None, [])
    result.outcome = Outcome(decision=decision)
    return result


@pytest.mark.parametrize("ratio", [0.9, 0.999, 1.0, 1.2])
def test_the_last_line_never_reports_a_slower_model(ratio):
    decision = one_record(_fixed(ratio))
    line = verdict_line(_result(decision))
    match = LAST_LINE.fullmatch(line)
    assert match, line
    assert float(match.group(1)) >= 1.0
    if ratio - 0.01 > 1.0:
        assert line == "tuned model: 1.20× the default (95% CI 1.19–1.21, 40 rounds)"
    else:
        assert "the default is kept" in line
    assert "the default is kept" in verdict_line(_result(None))


def test_a_tuned_model_that_fails_to_build_is_dropped_with_why():
    records = [Record("a", "mm1", 0.3)]
    decision = decide(records, lambda tasks: Estimate.failed("compile error: x"), lambda: True)
    assert decision.kept == () and "not measured: compile error: x" in decision.reasons["a"]
