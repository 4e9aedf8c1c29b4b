"""How the dashboard's verdicts (polyonnx/bench/levels.py) behave on synthetic series of 20
runs: how often steady noise is flagged, and whether steps and drifts are flagged once, at
the right run. Nothing is timed: the series are made up, so the table is the same on every
machine. Run: python perf/dashboard_verdicts.py [--series 1000] (docs/dashboard.md quotes
its output)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np

from polyonnx.bench.levels import THRESHOLD, WINDOW, Z_MIN, judge_series

RUNS = 20
AT = 10


def flagged(values: list[float]) -> list[int]:
    return [i for i, v in enumerate(judge_series(values)) if v and v.flagged]


def share(count: int, make: Callable[[np.random.Generator], list[float]], ok) -> str:
    hits = sum(ok(flagged(make(np.random.default_rng(seed)))) for seed in range(count))
    return f"{hits / count:.1%}"


def rows(count: int) -> list[tuple[str, str, str]]:
    def alternating(amplitude: float) -> list[float]:
        return [1 + amplitude * (-1) ** i for i in range(RUNS)]

    def uniform(rng, amplitude=0.03) -> list[float]:
        return list(1 + rng.uniform(-amplitude, amplitude, RUNS))

    def step(values, size, at=AT) -> list[float]:
        return [v * (size if i >= at else 1) for i, v in enumerate(values)]

    def any_flag(found):
        return bool(found)

    def once_at(at):
        return lambda found: found == [at]

    phases = [once_at(at)(flagged(step(alternating(0.03), 1.1, at))) for at in range(WINDOW, 15)]
    steady = f"{any_flag(flagged(alternating(0.03))):.0%}"
    table = [
        ("steady, alternating +-3%", "series flagged", steady),
        ("steady, uniform within +-3%", "series flagged", share(count, uniform, any_flag)),
    ]
    for sigma in (0.01, 0.02, 0.03, 0.05):

        def normal(rng, s=sigma) -> list[float]:
            return list(1 + s * rng.standard_normal(RUNS))

        table.append((f"steady, normal noise sigma {sigma:.0%}", "series flagged",
                      share(count, normal, any_flag)))  # fmt: skip
    for size in (1.2, 1.1, 0.8, 0.9):
        table.append(
            (
                f"{size - 1:+.0%} step at run {AT}, uniform +-3%",
                f"flagged once, at run {AT}",
                share(count, lambda rng, z=size: step(uniform(rng), z), once_at(AT)),
            )
        )
    table.append(
        (
            f"+10% step at run {AT}, uniform +-3%",
            "flagged once, at any run",
            share(count, lambda rng: step(uniform(rng), 1.1), lambda found: len(found) == 1),
        )
    )
    table.append(
        (
            f"+10% step at each run {WINDOW}..14, alternating +-3%",
            "flagged once, at the step",
            f"{sum(phases) / len(phases):.0%}",
        )
    )
    drift = flagged([1 + 0.01 * i for i in range(RUNS)])
    table.append(("1%-a-run drift", "flagged at runs", ", ".join(map(str, drift)) or "none"))
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=1000, help="seeded series per row")
    args = parser.parse_args(argv)
    print(f"threshold {THRESHOLD:.1%}, z {Z_MIN:g}, window {WINDOW}; {RUNS} runs a series,")
    print(f"{args.series} seeded series a row where random; between-run noise only\n")
    print("| series | measured | result |")
    print("| --- | --- | --- |")
    for series, measured, result in rows(args.series):
        print(f"| {series} | {measured} | {result} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
