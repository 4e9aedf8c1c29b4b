"""The model-level A/B that ends every tuning session: are the tuned records worth using?

A record's kernel-level speed-up is measured on the kernel alone; in the model, with the
other kernels around it and other work on the machine, it may not show (docs/tuning.md,
'The model-level A/B', and docs/measurements.md). So the default model
and the tuned model, each compiled once, are timed in alternating rounds, and the records
are kept only if the tuned model is faster beyond the measured noise:

    estimate = paired_rounds(timer(default.run), timer(tuned.run), deadline)
    estimate.faster      # the 95% CI of default / tuned lies above 1

Statistics. Round r times a block of each model, the order flipped every round (AB, BA,
...), and gives one ratio default_r / tuned_r. A slow phase of the machine slows both
halves of a round, so the per-round ratio holds still where the two models' separate
medians drift apart (bench/paired.py's reasoning; tune/ may not import bench/). The
estimate is the median of the per-round ratios; its confidence interval is the
distribution-free one for a median, between two order statistics of the ratios chosen by
the binomial distribution (the sign test's; coverage at least the level, whatever the
shape of the noise). A bootstrap of the median was tried first and is too narrow over few
rounds: on synthetic noise alone, 12 rounds read 1.006-1.031 (tests/tune/test_verdict.py).

Rounds go on until, at a look, the STOP_LEVEL interval excludes 1 (a confident verdict
either way) or the 95% interval is narrower than SETTLED (any difference too small to
matter); or until the deadline or MAX_ROUNDS, when the verdict reads the 95% interval.
Looks come at MIN_ROUNDS and then every half as many rounds again (12, 18, 27, ...: a
dozen up to MAX_ROUNDS), each at the stricter level, so that looking often does not buy
a false verdict: at most about 12 x 0.25% + 2.5% that noise alone reads as faster.

Subsets. If the whole tuned set is not faster, `decide` tries subsets: the records ranked
by expected gain (the task's share of the model's time times its kernel-level saving),
dropping those of least gain first (one, then two, four, ... until one is left), while
the time allows. The first subset that is faster is kept; nothing kept is the default.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.quiet import wait_until_quiet

LEVEL = 0.95
"""The confidence of the reported interval and of the verdict."""
STOP_LEVEL = 0.995
"""Rounds stop early once an interval this wide excludes 1."""
SETTLED = 0.01
"""... or once the 95% interval is narrower than this (a difference under ~0.5%)."""
MIN_ROUNDS = 12
MAX_ROUNDS = 400
LOOK_GROWTH = 1.5
"""The stopping rule is read at MIN_ROUNDS, then each time the rounds grew by this factor."""
MIN_BLOCK_S = 0.01
"""A block of one model's runs lasts at least this long (more runs for a fast model)."""


@dataclass(frozen=True)
class Estimate:
    """How much faster the tuned model ran: ``ratio`` default / tuned (> 1: faster), its
    confidence interval ``low``-``high``, over ``rounds`` paired rounds; the two models'
    median seconds per run."""

    ratio: float
    low: float
    high: float
    rounds: int
    default_s: float
    tuned_s: float
    failure: str = ""
    """Why the tuned model could not be built or run (then nothing was measured)."""

    @staticmethod
    def failed(why: str) -> Estimate:
        return Estimate(0.0, 0.0, 0.0, 0, 0.0, 0.0, why)

    @property
    def faster(self) -> bool:
        """Faster beyond the noise: the whole interval lies above 1 (and so the estimate)."""
        return not self.failure and self.low > 1.0 and self.ratio > 1.0

    def text(self) -> str:
        """``1.04× (95% CI 1.01–1.07, 40 rounds)``; a bound within 0.005 of 1 gets three
        decimals, so that an interval that holds 1 never reads as one above it."""
        if self.failure:
            return f"not measured: {self.failure}"
        low, high = _bound(self.low), _bound(self.high)
        return f"{self.ratio:.2f}× (95% CI {low}–{high}, {self.rounds} rounds)"


def _bound(value: float) -> str:
    return f"{value:.3f}" if abs(value - 1.0) < 0.005 else f"{value:.2f}"


def estimate(default: Sequence[float], tuned: Sequence[float], level: float = LEVEL) -> Estimate:
    """The median of the per-round ratios default / tuned and its ``level`` interval."""
    a, b = np.asarray(default, dtype=float), np.asarray(tuned, dtype=float)
    if len(a) != len(b) or len(a) == 0 or (a <= 0).any() or (b <= 0).any():
        raise ValueError(f"need equal, non-empty positive timings, got {len(a)} and {len(b)}")
    ratios = np.sort(a / b)
    low, high = median_interval(ratios, level)
    return Estimate(
        float(np.median(ratios)), low, high, len(ratios), float(np.median(a)),
        float(np.median(b)),
    )  # fmt: skip


def median_interval(values: Sequence[float], level: float) -> tuple[float, float]:
    """The distribution-free ``level`` interval for the median of ``values``: the k-th
    smallest and k-th largest, k the most order statistics a tail of Binomial(n, 1/2)
    holding at most (1 - level) / 2 allows (the whole range when n is too small)."""
    ordered = sorted(values)
    n = len(ordered)
    alpha = (1.0 - level) / 2.0
    k, tail = 0, 0.0  # tail: P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2:
        more = tail + math.comb(n, k) / (1 << n)
        if more > alpha:
            break
        k, tail = k + 1, more
    k = max(k, 1)
    return float(ordered[k - 1]), float(ordered[n - k])


def settled(default: Sequence[float], tuned: Sequence[float]) -> bool:
    """Whether more rounds would not change the verdict (module docstring)."""
    strict = estimate(default, tuned, STOP_LEVEL)
    if strict.low > 1.0 or strict.high < 1.0:
        return True
    usual = estimate(default, tuned)
    return usual.high - usual.low < SETTLED


def paired_rounds(
    time_default: Callable[[], float],
    time_tuned: Callable[[], float],
    deadline: float,
    *,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    clock: Callable[[], float] = time.monotonic,
) -> Estimate:
    """Rounds of one block of each model (``time_*``: seconds per run of a block), the
    order flipped every round, until the verdict is settled, ``deadline`` (a ``clock``
    value) or ``max_rounds``; at least ``min_rounds`` whatever the deadline."""
    default: list[float] = []
    tuned: list[float] = []
    look = min_rounds
    for r in range(max_rounds):
        if r >= min_rounds:
            if clock() >= deadline:
                break
            if r >= look:
                if settled(default, tuned):
                    break
                look = max(look + 1, math.ceil(look * LOOK_GROWTH))
        if r % 2 == 0:
            default.append(time_default())
            tuned.append(time_tuned())
        else:
            tuned.append(time_tuned())
            default.append(time_default())
    return estimate(default, tuned)


def timer(run: Callable[[], object], calls: int, threads: int) -> Callable[[], float]:
    """A block of ``run``: once the last block's idle threads stopped spinning
    (quiet.py), one untimed run (it wakes this model's threads and warms its caches),
    then ``calls`` timed runs; their median, in seconds. The median, not the mean: on a
    busy machine the runs the scheduler preempted would decide the block (docs/tuning.md,
    "The model-level A/B")."""

    def block() -> float:
        if threads > 1:
            wait_until_quiet()
        run()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    return block


def calls_per_block(run: Callable[[], object]) -> int:
    """Runs of ``run`` in a block of at least MIN_BLOCK_S (after three warm-up runs)."""
    for _ in range(2):
        run()
    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    return max(1, math.ceil(MIN_BLOCK_S / max(once, 1e-9)))


@dataclass(frozen=True)
class Record:
    """A record the A/B weighs: its task (hash), a name for the report, and its expected
    gain (share of the model's time times its kernel-level saving)."""

    task: str
    name: str
    gain: float


@dataclass(frozen=True)
class Attempt:
    """One A/B: the tasks whose records the tuned model ran, and what it measured."""

    tasks: tuple[str, ...]
    estimate: Estimate


@dataclass(frozen=True)
class Decision:
    """Which records stay in use (``kept``: tasks; empty: the default is kept), every A/B
    tried, in order, and why each other record was dropped."""

    kept: tuple[str, ...]
    attempts: tuple[Attempt, ...]
    reasons: dict[str, str]

    @property
    def final(self) -> Estimate | None:
        """The A/B of the kept set (None: nothing kept)."""
        for attempt in self.attempts:
            if attempt.tasks == self.kept and self.kept:
                return attempt.estimate
        return None


def subsets(records: Sequence[Record]) -> list[tuple[str, ...]]:
    """The sets `decide` tries, in order: all records, then those of most expected gain,
    dropping one, two, four, ... of least gain, down to the single best one."""
    ranked = tuple(r.task for r in sorted(records, key=lambda r: -r.gain))
    sizes, drop = [len(ranked)], 1
    while len(ranked) - drop >= 1:
        sizes.append(len(ranked) - drop)
        drop *= 2
    if len(ranked) > 1 and sizes[-1] != 1:
        sizes.append(1)
    return [ranked[:n] for n in sizes if n >= 1]


def decide(
    records: Sequence[Record],
    measure: Callable[[tuple[str, ...]], Estimate],
    time_left: Callable[[], bool],
) -> Decision:
    """Try `subsets` with ``measure`` (the first always, the others while ``time_left``)
    until one makes the model faster beyond the noise; the reasons name the A/B that
    dropped each other record."""
    attempts: list[Attempt] = []
    kept: tuple[str, ...] = ()
    for number, tasks in enumerate(subsets(records)):
        if number and not time_left():
            break
        attempts.append(Attempt(tasks, measure(tasks)))
        if attempts[-1].estimate.faster:
            kept = tasks
            break
    reasons = {}
    for record in records:
        if record.task in kept:
            continue
        smallest = min((a for a in attempts if record.task in a.tasks), key=lambda a: len(a.tasks))
        reasons[record.task] = (
            f"the model with {_records(len(smallest.tasks))}: {smallest.estimate.text()}"
            if smallest.estimate.failure
            else f"the model with {_records(len(smallest.tasks))} ran "
            f"{smallest.estimate.text()}: not faster beyond the noise"
        )
        if kept:
            reasons[record.task] += f"; kept without it: {len(kept)} of {len(records)}"
    return Decision(kept, tuple(attempts), reasons)


def _records(n: int) -> str:
    return "this record" if n == 1 else f"it and {n - 1} other record{'s' * (n > 2)}"
