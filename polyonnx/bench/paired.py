"""Paired rounds: polyonnx and a baseline timed turn about, the ratio taken per round.

A suite's medians of polyonnx and of its baseline come from benchmarks run seconds apart,
and this VM's speed drifts by 10-50% between phases: the ratio of two medians then swings
as much (light ResNet-50 at 2 threads read 1.14-1.19 in some runs, 1.49 in another).
Timed in rounds that alternate the two, a slow phase slows both sides of a round, and the
median of the per-round ratios holds still.

Each round times a batch of calls of each contender (enough calls that polyonnx's batch
takes MIN_BATCH_S), the order flipped every round; with threads, each turn starts once the
last one's idle threads stopped spinning (quiet.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from polyonnx.quiet import wait_until_quiet

MIN_ROUNDS = 5
MAX_ROUNDS = 21
BUDGET_S = 3.0
"""Rounds go on while under MAX_ROUNDS and this many seconds, and at least MIN_ROUNDS."""
MIN_BATCH_S = 0.002


@dataclass(frozen=True)
class Paired:
    """Per-round ratios of polyonnx's time to one baseline's: their median and quartiles."""

    median: float
    q1: float
    q3: float
    rounds: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "q1": self.q1, "q3": self.q3, "rounds": self.rounds}


def paired_ratios(
    ours: Callable[[], object],
    baselines: Mapping[str, Callable[[], object]],
    threads: int = 1,
    budget: float = BUDGET_S,
) -> dict[str, Paired]:
    """Time ``ours`` and every baseline in alternating rounds; per baseline, the per-round
    ratios ours / baseline (< 1: ours is faster)."""
    contenders = {"polyonnx": ours, **baselines}
    first = _timed(ours, 1)
    calls = max(1, int(MIN_BATCH_S / max(first, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in contenders}
    start = time.perf_counter()
    names = list(contenders)
    for r in range(MAX_ROUNDS):
        if r >= MIN_ROUNDS and time.perf_counter() - start > budget:
            break
        for name in names if r % 2 == 0 else reversed(names):
            if threads > 1:
                wait_until_quiet()
            times[name].append(_timed(contenders[name], calls))
    result = {}
    for name in baselines:
        ratios = [o / b for o, b in zip(times["polyonnx"], times[name], strict=True)]
        q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        result[name] = Paired(median, q1, q3, len(ratios))
    return result


def _timed(fn: Callable[[], object], calls: int) -> float:
    """Seconds a call of ``fn``, over a batch of ``calls``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls
