"""What one pytest-benchmark record of the perf/ suite measured, and its baselines.

Every polyonnx figure in perf/ has its baselines measured in the same run. A record names
its case, implementation and thread count in ``extra_info`` (test_kernels, test_models);
suites without ``extra_info`` (test_mlp, test_schedule_tutorial) are read from their names:
``test_onnxruntime`` is the baseline, every other test a polyonnx variant ``case/variant``
whose baselines are those of ``case``.

A benchmark is a polyonnx (case, threads); its baselines are the onnxruntime and numpy
records of the same case (the part before a '/') at the same thread count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BASELINES = ("onnxruntime", "numpy")


@dataclass(frozen=True)
class Measurement:
    """One record: the median and quartiles in seconds, and the per-round times when the
    run was saved with them (``--benchmark-save-data``; empty otherwise)."""

    case: str
    impl: str
    threads: int
    flops: int | None
    median: float
    q1: float
    q3: float
    rounds: int
    data: tuple[float, ...] = ()
    paired: dict[str, float] = field(default_factory=dict)
    """Baseline -> the median of per-round ratios polyonnx / baseline from rounds that
    alternated the two (polyonnx/bench/paired.py), where the run measured them."""
    peak: float | None = None
    """The FMA peak of one core (GFLOP/s) measured right after this benchmark, where the
    run did (a contraction's polyonnx benchmark): the clock of a VM drifts over a run."""

    @property
    def key(self) -> tuple[str, int]:
        return self.case, self.threads

    @property
    def base(self) -> tuple[str, int]:
        """The case whose baselines apply (the part before a '/'), and the threads."""
        return self.case.split("/")[0], self.threads


@dataclass(frozen=True)
class Row:
    """A polyonnx benchmark with the medians of polyonnx and its baselines."""

    case: str
    threads: int
    flops: int | None = None
    medians: dict[str, float] = field(default_factory=dict)
    paired: dict[str, float] = field(default_factory=dict)
    peak: float | None = None
    """As Measurement.peak."""


def describe(bench: dict) -> tuple[str, str, int, int | None]:
    """(case, implementation, threads, flops) of one pytest-benchmark record."""
    info = bench.get("extra_info") or {}
    if "impl" in info:
        return info["case"], info["impl"], int(info["threads"]), info.get("flops")
    test = bench["name"].split("[")[0].removeprefix("test_")
    group = bench.get("group") or test
    threads = (bench.get("params") or {}).get("threads")
    if threads is None:
        found = re.search(r"-(\d+)threads?$", group)
        threads = int(found[1]) if found else 1
    case = re.sub(r"-\d+threads?$", "", group)
    if test in BASELINES:
        return case, test, int(threads), None
    return (case if test == "polyonnx" else f"{case}/{test}"), "polyonnx", int(threads), None


def measurement(bench: dict) -> Measurement:
    case, impl, threads, flops = describe(bench)
    stats = bench["stats"]
    return Measurement(
        case=case,
        impl=impl,
        threads=threads,
        flops=flops,
        median=float(stats["median"]),
        q1=float(stats.get("q1", stats["median"])),
        q3=float(stats.get("q3", stats["median"])),
        rounds=int(stats.get("rounds", len(stats.get("data", ())))),
        data=tuple(float(t) for t in stats.get("data", ())),
        paired={
            base: float(found["median"])
            for base, found in ((bench.get("extra_info") or {}).get("paired") or {}).items()
        },
        peak=(bench.get("extra_info") or {}).get("peak_gflops_per_core"),
    )


def rows(measured: list[Measurement]) -> list[Row]:
    """One row per polyonnx (case, threads), in the order the suite ran them, with the
    medians of its baselines."""
    baselines = {(m.base, m.impl): m.median for m in measured if m.impl != "polyonnx"}
    ours = [m for m in measured if m.impl == "polyonnx"]
    order = {case: i for i, case in reversed(list(enumerate(m.case for m in ours)))}
    result = {}
    for m in ours:
        medians = {"polyonnx": m.median}
        medians |= {b: baselines[m.base, b] for b in BASELINES if (m.base, b) in baselines}
        result[m.key] = Row(m.case, m.threads, m.flops, medians, dict(m.paired), m.peak)
    return sorted(result.values(), key=lambda row: (order[row.case], row.threads))


def table_rows(benchmarks: list[dict]) -> list[Row]:
    """The rows of a pytest-benchmark JSON's ``benchmarks`` list."""
    return rows([measurement(bench) for bench in benchmarks])


def seconds(value: float | None) -> str:
    """A time with 3 significant digits in s, ms, us or ns; "-" for None."""
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"
