"""Regressions and improvements of one run against another (``polyonnx bench --compare``,
the CI gate), and the series of a machine's runs that the dashboard judges.

In the gate, a polyonnx measurement is judged against one reference run:

- its change is its median over the reference median, minus 1 (+0.20: 20% slower);
- it is significant when the Mann–Whitney U test of its per-round times against the
  reference's gives p < alpha. Runs saved without per-round data cannot be tested, and
  are judged by the threshold alone.

A regression is a significant change above ``threshold``, an improvement one below
``-threshold``; anything else is noise. Two runs alone say nothing of how much whole runs
vary on the machine, so the gate wants a quiet machine. The dashboard has the history,
and judges each run against its series' level and run-to-run spread instead
(levels.py). Baselines are measured in the same runs and shown beside, never judged: they
tell a slower machine from a slower compiler.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from polyonnx.bench.cases import BASELINES, Measurement
from polyonnx.bench.history import Machine, Run
from polyonnx.bench.levels import DEFAULT, Settings, flag, usable
from polyonnx.bench.levels import Verdict as LevelVerdict
from polyonnx.bench.stats import mann_whitney_u

THRESHOLD = 0.05
ALPHA = 0.01


@dataclass(frozen=True)
class Verdict:
    """``before``: the reference median (seconds); ``change``: current median / before - 1;
    ``p_value``: None where a side has no per-round data; ``kind``: "regression",
    "improvement" or "noise"."""

    before: float
    change: float
    p_value: float | None
    kind: str
    reference_runs: int

    @property
    def flagged(self) -> bool:
        return self.kind != "noise"

    @property
    def p_text(self) -> str:
        if self.p_value is None:
            return "no per-round data"
        return "p < 1e-15" if self.p_value < 1e-15 else f"p = {self.p_value:.2g}"

    def describe(self) -> str:
        p = self.p_text
        against = "the reference run"
        if self.reference_runs > 1:
            against = f"the median of {self.reference_runs} previous runs"
        return f"{self.change:+.1%} against {against} ({p}): {self.kind}"


def judge(
    reference: list[Measurement],
    current: Measurement,
    threshold: float = THRESHOLD,
    alpha: float = ALPHA,
) -> Verdict:
    """``current`` against the ``reference`` measurements (at least one)."""
    before = statistics.median(m.median for m in reference)
    change = current.median / before - 1.0
    pooled = [t for m in reference for t in m.data]
    p_value = mann_whitney_u(current.data, pooled).p_value if current.data and pooled else None
    significant = p_value is None or p_value < alpha
    kind = "noise"
    if significant and change > threshold:
        kind = "regression"
    elif significant and change < -threshold:
        kind = "improvement"
    return Verdict(before, change, p_value, kind, len(reference))


# -- one run against another (the CI gate) -----------------------------------------------


@dataclass(frozen=True)
class Change:
    """A polyonnx benchmark measured in both runs, and its baselines' medians
    (impl -> (before, after))."""

    case: str
    threads: int
    before: Measurement
    after: Measurement
    verdict: Verdict
    baselines: dict[str, tuple[float, float]]


def compare_runs(
    before: Run, after: Run, threshold: float = THRESHOLD, alpha: float = ALPHA
) -> list[Change]:
    """Every polyonnx benchmark in both runs, judged, in ``after``'s order."""
    old = {(m.key, m.impl): m for m in before.measurements}
    new = {(m.key, m.impl): m for m in after.measurements}
    changes = []
    for m in after.measurements:
        if m.impl != "polyonnx" or (m.key, m.impl) not in old:
            continue
        baselines = {
            impl: (old[m.base, impl].median, new[m.base, impl].median)
            for impl in BASELINES
            if (m.base, impl) in old and (m.base, impl) in new
        }
        verdict = judge([old[m.key, m.impl]], m, threshold, alpha)
        changes.append(Change(m.case, m.threads, old[m.key, m.impl], m, verdict, baselines))
    return changes


# -- series over a machine's runs (the dashboard) ----------------------------------------


@dataclass(frozen=True)
class Point:
    """One run of a series: ``index`` is the run's place among its machine's runs;
    ``verdict`` is None for the first runs of a series (too few to set a level);
    ``baseline_changes``: how each baseline's median moved against the runs that set the
    level polyonnx was judged against (empty without a verdict). A baseline that moved as
    much as polyonnx points at the machine, not the compiler."""

    index: int
    run: Run
    polyonnx: Measurement
    baselines: dict[str, Measurement]
    verdict: LevelVerdict | None
    baseline_changes: dict[str, float]


@dataclass(frozen=True)
class Series:
    machine: Machine
    case: str
    threads: int
    flops: int | None
    points: tuple[Point, ...]

    @property
    def name(self) -> str:
        return f"{self.case} · {self.threads} thread{'s' if self.threads > 1 else ''}"

    @property
    def latest(self) -> Point:
        return self.points[-1]


def machine_series(runs: list[Run], settings: Settings = DEFAULT) -> list[Series]:
    """The series of one machine's ``runs`` (oldest first): one per polyonnx benchmark,
    in the order the newest run that has it ran them, judged by levels.flag. A run that
    lacks a benchmark, or whose median is not a positive number, is missing from its
    series."""
    found: dict[tuple[str, int], list[tuple[int, Run, Measurement, dict]]] = {}
    order: dict[tuple[str, int], tuple[int, int]] = {}
    for index, run in enumerate(runs):
        baselines = {(m.key, m.impl): m for m in run.measurements if m.impl != "polyonnx"}
        for position, m in enumerate(run.measurements):
            if m.impl != "polyonnx" or not usable(m.median):
                continue
            theirs = {b: baselines[m.base, b] for b in BASELINES if (m.base, b) in baselines}
            found.setdefault(m.key, []).append((index, run, m, theirs))
            order[m.key] = (-index, position)
    series = []
    for key in sorted(found, key=order.__getitem__):
        entries = found[key]
        verdicts = flag([m for _, _, m, _ in entries], settings)
        points = []
        for (index, run, m, theirs), verdict in zip(entries, verdicts, strict=True):
            reference = [entries[p] for p in verdict.reference] if verdict else []
            moved = {}
            for impl, now in theirs.items():
                before = [e[3][impl].median for e in reference if impl in e[3]]
                if before:
                    moved[impl] = now.median / statistics.median(before) - 1.0
            points.append(Point(index, run, m, theirs, verdict, moved))
        points = tuple(points)
        latest = points[-1].polyonnx
        series.append(Series(runs[0].machine, key[0], key[1], latest.flops, points))
    return series


def by_machine(runs: list[Run]) -> dict[Machine, list[Run]]:
    """Runs grouped by machine (oldest first in each), machines with the newest run
    first."""
    groups: dict[Machine, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.machine, []).append(run)
    return dict(sorted(groups.items(), key=lambda item: item[1][-1].datetime, reverse=True))
