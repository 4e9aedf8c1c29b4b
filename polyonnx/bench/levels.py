"""Level shifts in a benchmark's series: each run judged against the level that earlier
runs set and the spread between runs, so that a machine's run-to-run noise is not reported
as a change (docs/dashboard.md, "When a change is flagged", says why this design).

A series is cut into levels. A level is set by its first ``window`` runs (their mean), and
every later run is compared with the level it follows:

- its ``change`` is its median over the level, minus 1;
- its ``z`` is that change over the noise of the comparison: the between-run spread (the
  standard deviation of the runs that set the levels about their level, pooled over the
  current level and those set in the last ``lookback`` runs), widened for a level set by
  few runs, and the run's own uncertainty (the standard error of its median, from its
  quartiles and rounds: a run whose rounds are spread wide is no confident verdict);
- it is a regression when the change is at least ``threshold`` and z at least ``z_min``,
  an improvement when both are as far below zero, and noise otherwise.

A flagged run starts a new level, so a step is flagged once and later runs are judged
against the new level, with the spread the earlier levels measured until the new one has
its own (as Conbench's lookback z-score does after a distribution change). Hindsight
corrects two cases, as asv's step detection would: when the run after a flagged one is
back at the old level and would be a change against the new one, the flagged run was an
outlier (marked so; the old level goes on); when the run before a flagged one, which noise
kept under the threshold, fits the new level better than the old, the step is placed
there. A series has no verdict until its first ``window`` runs have set a level, nor has
a missing value (None, not finite, or not positive).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from polyonnx.bench.cases import Measurement

THRESHOLD = 0.075
"""Two runs of a steady benchmark within +-3% of its level differ by at most 6.2%: a
threshold above that never flags such noise, whatever its pattern."""
Z_MIN = 3.0
WINDOW = 5
LOOKBACK = 20
MEDIAN_SE = 1.2533  # the standard error of a median is about 1.2533 sigma / sqrt(n)
IQR_SIGMA = 1.349  # a normal distribution's interquartile range is 1.349 sigma


@dataclass(frozen=True)
class Verdict:
    """``before``: the level (seconds); ``change``: this run's median / before - 1;
    ``z``: the change in units of its noise; ``spread``: the relative between-run spread
    used; ``within``: the relative standard error of this run's median; ``kind``:
    "regression", "improvement", "noise" or "outlier"; ``reference``: the positions in
    the series of the runs that set the level."""

    before: float
    change: float
    z: float
    spread: float
    within: float
    kind: str
    reference: tuple[int, ...]
    level_change: float | None = None
    """Where hindsight placed a step at this run: the change of the new level (this run and
    the next) against the old."""

    @property
    def flagged(self) -> bool:
        return self.kind in ("regression", "improvement")

    @property
    def reference_runs(self) -> int:
        return len(self.reference)

    @property
    def z_text(self) -> str:
        return "z = inf" if math.isinf(self.z) else f"z = {self.z:+.1f}"

    def describe(self) -> str:
        runs = self.reference_runs
        against = f"the level of {runs} run{'s' * (runs != 1)}"
        noise = f"run-to-run spread {self.spread:.1%}, within-run {self.within:.1%}"
        what = self.kind
        if self.kind == "outlier":
            what = "outlier (the next run was back at the level)"
        if self.level_change is not None:
            what += f", where a new level begins (with the next run, {self.level_change:+.1%})"
        return f"{self.change:+.1%} against {against} ({self.z_text}; {noise}): {what}"


@dataclass(frozen=True)
class Settings:
    threshold: float = THRESHOLD
    z_min: float = Z_MIN
    window: int = WINDOW
    lookback: int = LOOKBACK


DEFAULT = Settings()


def usable(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def within_error(m: Measurement) -> float:
    """The relative standard error of ``m``'s median, from its quartiles and rounds (0
    when they are unknown)."""
    spread = m.q3 - m.q1
    if m.rounds < 1 or not math.isfinite(spread) or spread <= 0:
        return 0.0
    return MEDIAN_SE * spread / IQR_SIGMA / math.sqrt(m.rounds) / m.median


def level_of(values: Sequence[float | None], positions: Sequence[int], window: int) -> float:
    return sum(values[p] for p in positions[:window]) / len(positions[:window])


def spread_of(
    values: Sequence[float | None], levels: Sequence[Sequence[int]], since: int, window: int
) -> float | None:
    """The relative between-run spread: the standard deviation of the runs that set each
    level about that level, pooled over the current level and the earlier ones set at or
    after position ``since`` (None before two runs set a level). Only the runs that set a
    level count, so that neither a slow drift nor a change too small to flag widens it."""
    squares, count, pooled = 0.0, 0, 0
    for j, positions in enumerate(levels):
        setting = positions[:window]
        if not setting or (j < len(levels) - 1 and setting[0] < since):
            continue
        level = level_of(values, setting, window)
        squares += sum((values[p] / level - 1.0) ** 2 for p in setting)
        count += len(setting)
        pooled += 1
    return math.sqrt(squares / (count - pooled)) if count > pooled else None


def verdict_for(
    values: Sequence[float | None],
    levels: Sequence[Sequence[int]],
    i: int,
    within: float,
    settings: Settings,
) -> Verdict | None:
    """Run ``i`` against the last of ``levels`` (the spread over all of them)."""
    current = levels[-1]
    spread = spread_of(values, levels, i - settings.lookback, settings.window)
    if spread is None:
        return None
    before = level_of(values, current, settings.window)
    reference = tuple(current[: settings.window])
    change = values[i] / before - 1.0
    sigma = math.sqrt(spread**2 * (1.0 + 1.0 / len(reference)) + within**2)
    z = change / sigma if sigma > 0 else math.copysign(math.inf, change)
    kind = "noise"
    if change >= settings.threshold and z >= settings.z_min:
        kind = "regression"
    elif change <= -settings.threshold and z <= -settings.z_min:
        kind = "improvement"
    return Verdict(before, change, z, spread, within, kind, reference)


def judge_series(
    values: Sequence[float | None],
    within: Sequence[float] | None = None,
    settings: Settings = DEFAULT,
) -> list[Verdict | None]:
    """The verdict of each run of a series of medians (oldest first; None or a bad value
    for a missing run), with each run's relative within-run error (0 if not given)."""
    errors = list(within) if within is not None else [0.0] * len(values)
    verdicts: list[Verdict | None] = [None] * len(values)
    levels: list[list[int]] = [[]]
    before_flag: list[list[int]] | None = None  # the levels before an unconfirmed flag
    for i, value in enumerate(values):
        if not usable(value):
            continue
        if sum(map(len, levels)) < settings.window:
            levels[-1].append(i)
            continue
        verdict = verdict_for(values, levels, i, errors[i], settings)
        if before_flag is not None and verdict is not None and verdict.flagged:
            back = verdict_for(values, before_flag, i, errors[i], settings)
            if back is not None and not back.flagged:  # the flagged run was an outlier
                flagged = levels[-1][0]
                verdicts[flagged] = replace(verdicts[flagged], kind="outlier")
                levels, verdict = before_flag, back
        before_flag = None
        verdicts[i] = verdict
        if verdict is None or not verdict.flagged:
            levels[-1].append(i)
            continue
        moved = placed(values, levels, i, errors, settings)
        if moved is None:
            before_flag = [list(p) for p in levels]
            levels.append([i])
        else:  # the step began before run i: not a one-run blip
            levels, updates = moved
            for p, found in updates.items():
                verdicts[p] = found
    return verdicts


def step_start(
    values: Sequence[float | None], current: Sequence[int], i: int, level: float, window: int
) -> int:
    """Where a step flagged at run ``i`` began: the run before it when that run is not one
    that set the level, lies on the same side, and the two fit one new level better than
    the old level fits it (least squares, as asv's step detection places a step), while
    the run before that is nearer the old level than the new one. A drift has no such
    break, and is flagged where it passes the threshold."""
    if len(current) < window + 1 or current[-1] != i - 1:
        return i
    before, prior = values[i - 1], values[current[-2]]
    new = (before + values[i]) / 2
    if (before > level) != (values[i] > level):
        return i
    split = (before - new) ** 2 + (values[i] - new) ** 2
    if split < (before - level) ** 2 and abs(prior - level) < abs(prior - new):
        return i - 1
    return i


def placed(
    values: Sequence[float | None],
    levels: list[list[int]],
    i: int,
    errors: Sequence[float],
    settings: Settings,
) -> tuple[list[list[int]], dict[int, Verdict]] | None:
    """When a step flagged at run ``i`` began at an earlier run (that noise kept under
    the threshold): the levels with the new one starting there, and the verdicts that
    change (the earlier run flagged, the runs after it judged against the new level);
    None when it began at ``i`` or the runs after the start do not fit one new level."""
    current = levels[-1]
    level = level_of(values, current, settings.window)
    start = step_start(values, current, i, level, settings.window)
    if start == i:
        return None
    old = [*levels[:-1], [p for p in current if p < start]]
    first = verdict_for(values, old, start, errors[start], settings)
    if first is None:
        return None
    kind = "regression" if values[i] > level else "improvement"
    new = (values[start] + values[i]) / 2 / level - 1.0
    updates = {start: replace(first, kind=kind, level_change=new)}
    trial = [*old, [start]]
    for p in [q for q in current if q > start] + [i]:
        verdict = verdict_for(values, trial, p, errors[p], settings)
        if verdict is None or verdict.flagged:
            return None
        updates[p] = verdict
        trial[-1].append(p)
    return trial, updates


def flag(measured: Sequence[Measurement], settings: Settings = DEFAULT) -> list[Verdict | None]:
    """The verdicts of a series of measurements (oldest first)."""
    values = [m.median for m in measured]
    errors = [within_error(m) if usable(m.median) else 0.0 for m in measured]
    return judge_series(values, errors, settings)
