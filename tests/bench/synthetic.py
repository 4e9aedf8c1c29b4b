"""Synthetic histories in pytest-benchmark's storage format, with known changes.

``known_history(directory)`` writes eight runs of one machine (and, with ``other_machine``,
interleaved runs of a second, twice slower machine) where, among the polyonnx benchmarks:

- matmul-256 (1 thread) regresses by 20% at run 5 and stays there;
- conv-3x3-64to64-56 (2 threads) improves by 25% at run 6 and stays there;
- softmax-512x1024 (1 thread) wobbles by 3% around its level (each run within 3% of the
  median of the runs before it): significant with 40 rounds, but below the threshold;
- the others stay put (within per-round noise of 1%).

Baselines (onnxruntime, numpy for MatMul) are measured beside them and do not change.

``series_history(directory, factors)`` writes runs of arbitrary level factors (a steady
wobble, a step, a drift: ``alternating``, ``uniform``, ``step``, ``drift``), and
``measurements(factors)`` gives such a series as Measurements, for the verdicts alone.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.bench.cases import Measurement

MACHINE_DIR = "Linux-CPython-3.11-64bit"
ROUNDS = 40
RUNS = 8
REGRESSION = ("matmul-256", 1, 5, 1.20)  # case, threads, first run, factor
IMPROVEMENT = ("conv-3x3-64to64-56", 2, 6, 0.75)
WOBBLE = ("softmax-512x1024", 1, [1.0, 1.03, 1.0, 0.97, 1.0, 1.03, 1.0, 0.97])


@dataclass(frozen=True)
class Bench:
    case: str
    threads: int
    seconds: float
    flops: int | None
    baselines: tuple[str, ...]

    @property
    def key(self) -> tuple[str, int]:
        return self.case, self.threads


BENCHES = [
    Bench("matmul-256", 1, 320e-6, 2 * 256**3, ("onnxruntime", "numpy")),
    Bench("matmul-256", 2, 190e-6, 2 * 256**3, ("onnxruntime", "numpy")),
    Bench("conv-3x3-64to64-56", 1, 2.4e-3, 231211008, ("onnxruntime",)),
    Bench("conv-3x3-64to64-56", 2, 1.3e-3, 231211008, ("onnxruntime",)),
    Bench("softmax-512x1024", 1, 205e-6, None, ("onnxruntime",)),
    Bench("softmax-512x1024", 2, 260e-6, None, ("onnxruntime",)),
]
"""Every polyonnx benchmark of the synthetic suite (the names the overview must list)."""


def stats(data: np.ndarray, with_data: bool = True) -> dict:
    q1, median, q3 = np.percentile(data, [25, 50, 75])
    result = {
        "min": float(data.min()),
        "max": float(data.max()),
        "mean": float(data.mean()),
        "stddev": float(data.std(ddof=1)),
        "rounds": len(data),
        "median": float(median),
        "iqr": float(q3 - q1),
        "q1": float(q1),
        "q3": float(q3),
        "iqr_outliers": 0,
        "stddev_outliers": 0,
        "outliers": "0;0",
        "ld15iqr": float(data.min()),
        "hd15iqr": float(data.max()),
        "ops": float(1 / data.mean()),
        "total": float(data.sum()),
        "iterations": 1,
    }
    if with_data:
        result["data"] = [float(t) for t in data]
    return result


def record(
    case: str, impl: str, threads: int, flops: int | None, data: np.ndarray, with_data: bool
) -> dict:
    """One benchmark as perf/test_kernels.py records it."""
    name = f"test_{impl}[{case}-{threads}t]"
    return {
        "group": f"{case}-{threads}t",
        "name": name,
        "fullname": f"perf/test_kernels.py::{name}",
        "params": {"case": case, "threads": threads},
        "param": f"{case}-{threads}t",
        "extra_info": {"case": case, "impl": impl, "threads": threads, "flops": flops},
        "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": 5},
        "stats": stats(data, with_data),
    }


def run_json(
    records: list[dict],
    commit: str,
    when: str,
    node: str = "bench-box",
    cpu: str = "Test CPU 9000",
    dirty: bool = False,
) -> dict:
    return {
        "machine_info": {
            "node": node,
            "processor": "",
            "machine": "x86_64",
            "python_version": "3.11.7",
            "system": "Linux",
            "cpu": {"brand_raw": cpu, "count": 2, "arch": "X86_64"},
            "polyonnx": {
                "version": "0.1.0",
                "llvm_version": "22.1.0",
                "target": "znver4",
                "peak_gflops_per_core": 115.2,
            },
        },
        "commit_info": {"id": commit, "dirty": dirty, "branch": "main", "project": "main"},
        "benchmarks": records,
        "datetime": when,
        "version": "5.2.3",
        "suite": "quick",
    }


def write_run(directory: pathlib.Path, data: dict) -> pathlib.Path:
    """Save ``data`` as pytest-benchmark's autosave does: the next number in the folder,
    the commit id and the date in the name."""
    folder = directory / MACHINE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    numbers = [int(p.name[:4]) for p in folder.glob("[0-9][0-9][0-9][0-9]_*.json")]
    number = 1 + max(numbers, default=0)
    commit = data["commit_info"]
    stamp = data["datetime"][:19].replace("-", "").replace(":", "").replace("T", "_")
    dirty = "_uncommited-changes" if commit["dirty"] else ""
    path = folder / f"{number:04}_{commit['id']}_{stamp}{dirty}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def level(bench: Bench, run: int) -> float:
    """The true polyonnx time of ``bench`` at ``run``."""
    case, threads = bench.case, bench.threads
    factor = 1.0
    if (case, threads) == REGRESSION[:2] and run >= REGRESSION[2]:
        factor = REGRESSION[3]
    if (case, threads) == IMPROVEMENT[:2] and run >= IMPROVEMENT[2]:
        factor = IMPROVEMENT[3]
    if (case, threads) == WOBBLE[:2]:
        factor = WOBBLE[2][run]
    return bench.seconds * factor


def known_history(
    directory: pathlib.Path,
    other_machine: bool = False,
    with_data: bool = True,
    seed: int = 0,
) -> list[pathlib.Path]:
    """Write the runs described in the module docstring; their files, oldest first."""
    rng = np.random.default_rng(seed)
    paths = []
    for run in range(RUNS):
        for machine, slowdown in [("bench-box", 1.0)] + [("other-box", 2.0)] * other_machine:
            records = []
            for bench in BENCHES:
                noise = 1 + 0.01 * rng.standard_normal(ROUNDS)
                ours = level(bench, run) * slowdown * noise
                records.append(
                    record(bench.case, "polyonnx", bench.threads, bench.flops, ours, with_data)
                )
                for i, impl in enumerate(bench.baselines):
                    theirs = bench.seconds * (1.1 + 0.1 * i) * slowdown
                    theirs *= 1 + 0.01 * rng.standard_normal(ROUNDS)
                    records.append(
                        record(bench.case, impl, bench.threads, bench.flops, theirs, with_data)
                    )
            commit = f"{run:x}" * 40 if machine == "bench-box" else f"{run + 8:x}" * 40
            minute = 2 * run + (machine == "other-box")
            when = f"2026-11-{10 + run:02}T12:{minute:02}:00.000000+00:00"
            data = run_json(records, commit[:40], when, node=machine, dirty=run == RUNS - 1)
            paths.append(write_run(directory, data))
    return paths


# -- series of chosen levels ---------------------------------------------------------------


def alternating(runs: int, amplitude: float = 0.03) -> list[float]:
    """A steady level whose runs alternate +-amplitude around it: 1.03, 0.97, 1.03, ..."""
    return [1.0 + amplitude * (-1) ** i for i in range(runs)]


def uniform(runs: int, amplitude: float = 0.03, seed: int = 0) -> list[float]:
    """A steady level whose runs fall anywhere within +-amplitude of it (seeded)."""
    rng = np.random.default_rng(seed)
    return [float(f) for f in 1.0 + rng.uniform(-amplitude, amplitude, runs)]


def step(factors: Sequence[float], at: int, size: float) -> list[float]:
    """``factors`` times ``size`` from run ``at`` on (1.2: 20% slower)."""
    return [f * (size if i >= at else 1.0) for i, f in enumerate(factors)]


def drift(runs: int, rate: float = 0.01) -> list[float]:
    """A level that grows by ``rate`` of the first run's level every run."""
    return [1.0 + rate * i for i in range(runs)]


def rounds_of(level: float, rng: np.random.Generator, noise: float = 0.01) -> np.ndarray:
    return level * (1 + noise * rng.standard_normal(ROUNDS))


def measurement_of(data: np.ndarray) -> Measurement:
    q1, median, q3 = np.percentile(data, [25, 50, 75])
    return Measurement(
        "case", "polyonnx", 1, None, float(median), float(q1), float(q3), len(data),
        tuple(float(t) for t in data),
    )  # fmt: skip


def measurements(
    factors: Sequence[float], seconds: float = 1e-3, noise: float = 0.01, seed: int = 0
) -> list[Measurement]:
    """A series whose runs' true levels are ``seconds`` times ``factors``, each run of
    ROUNDS rounds with ``noise`` (relative, normal) between rounds."""
    rng = np.random.default_rng(seed)
    return [measurement_of(rounds_of(seconds * f, rng, noise)) for f in factors]


def series_history(
    directory: pathlib.Path, factors: dict[tuple[str, int], Sequence[float]], seed: int = 0
) -> list[pathlib.Path]:
    """Runs of one machine where each benchmark of BENCHES named in ``factors`` has those
    level factors (all the same length: the number of runs), with its baselines steady."""
    rng = np.random.default_rng(seed)
    runs = len(next(iter(factors.values())))
    paths = []
    for run in range(runs):
        records = []
        for bench in BENCHES:
            if bench.key not in factors:
                continue
            ours = rounds_of(bench.seconds * factors[bench.key][run], rng)
            records.append(record(bench.case, "polyonnx", bench.threads, bench.flops, ours, True))
            for i, impl in enumerate(bench.baselines):
                theirs = rounds_of(bench.seconds * (1.1 + 0.1 * i), rng)
                records.append(record(bench.case, impl, bench.threads, bench.flops, theirs, True))
        commit = hashlib.sha1(f"run {run}".encode()).hexdigest()
        when = f"2026-11-{1 + run // 24:02}T{run % 24:02}:00:00.000000+00:00"
        paths.append(write_run(directory, run_json(records, commit, when)))
    return paths
