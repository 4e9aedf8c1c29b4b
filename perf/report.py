"""One table of the perf/ suite: polyonnx against its baselines, measured in the same run.

    python perf/report.py --run                  # run the quick suite, then print the table
    POLYONNX_BENCH_FULL=1 python perf/report.py --run    # ... with the slow cases
    python perf/report.py --json FILE            # the table of an earlier run's JSON
    python perf/report.py --run -- -k matmul     # pytest arguments after --

Columns: the polyonnx median and the baselines' (onnxruntime; numpy's OpenBLAS for
MatMul), the ratios polyonnx / baseline (< 1: polyonnx is faster), and for contractions
polyonnx's GFLOP/s and its percent of the FMA peak of the cores it used:

    peak = threads x FMA pipes x fp32 lanes per pipe x 2 flops x clock

The pipes and lanes come from polyonnx's target (the CPU llvmlite detects), the clock from
sysfs (cpufreq's maximum); where sysfs has none, 3.6 GHz is assumed (and said), or give
``--clock-ghz``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / ".benchmarks" / "report.json"
BASELINES = ("onnxruntime", "numpy")
ASSUMED_GHZ = 3.6
FMA_PIPES = 2
DATAPATH_BITS = {"znver4": 256}
"""CPUs whose FMA pipes are narrower than their registers: Zen 4 runs each 512-bit FMA as
two halves on its two 256-bit pipes."""


@dataclass
class Row:
    case: str
    threads: int
    flops: int | None = None
    medians: dict[str, float] = field(default_factory=dict)


# -- running the suite -------------------------------------------------------------------


def run_suite(json_path: pathlib.Path, pytest_args: list[str]) -> tuple[float, float | None]:
    """Run ``pytest perf --benchmark-only`` into ``json_path``: (wall seconds, CPU seconds
    that other processes used meanwhile, None where /proc/stat cannot tell)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    benchmark = ["--benchmark-only", "--benchmark-quiet", f"--benchmark-json={json_path}"]
    command = [sys.executable, "-m", "pytest", "perf", *benchmark, "-q", "-p", "no:cacheprovider"]
    command += pytest_args
    full = os.environ.get("POLYONNX_BENCH_FULL") == "1"
    print("$ python", *command[1:], "  # POLYONNX_BENCH_FULL=1" if full else "", flush=True)
    busy, ours = cpu_busy_seconds(), children_cpu_seconds()
    start = time.perf_counter()
    code = subprocess.run(command, cwd=ROOT).returncode
    elapsed = time.perf_counter() - start
    if code not in (0, 1) or not json_path.exists():  # 1: some failed, the rest measured
        sys.exit(f"pytest exited with {code}")
    if code == 1:
        print("(!) some benchmarks failed: the table has the ones measured")
    after = cpu_busy_seconds()
    if busy is None or after is None:
        return elapsed, None
    return elapsed, after - busy - (children_cpu_seconds() - ours)


def cpu_busy_seconds() -> float | None:
    """CPU seconds used since boot by all processes, and stolen by the hypervisor (Linux
    /proc/stat)."""
    try:
        fields = pathlib.Path("/proc/stat").read_text().split("\n")[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- the table ---------------------------------------------------------------------------


def describe(bench: dict) -> tuple[str, str, int, int | None]:
    """(case, implementation, threads, flops) of one pytest-benchmark record. Suites that
    record no ``extra_info`` (test_mlp, test_schedule_tutorial) are read from their names:
    test_onnxruntime is the baseline, every other test a polyonnx variant."""
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
        return case, test, threads, None
    return (case if test == "polyonnx" else f"{case}/{test}"), "polyonnx", threads, None


def table_rows(benchmarks: list[dict]) -> list[Row]:
    """One row per polyonnx (case, threads), in the order the suite ran them, with the
    baselines of its case (the part before a '/') at the same thread count."""
    rows: dict[tuple[str, int], Row] = {}
    baselines: dict[tuple[str, int, str], float] = {}
    order: dict[str, int] = {}
    for bench in benchmarks:
        case, impl, threads, flops = describe(bench)
        median = bench["stats"]["median"]
        if impl == "polyonnx":
            order.setdefault(case, len(order))
            rows[case, threads] = Row(case, threads, flops, {"polyonnx": median})
        else:
            baselines[case.split("/")[0], threads, impl] = median
    for row in rows.values():
        for impl in BASELINES:
            if (row.case.split("/")[0], row.threads, impl) in baselines:
                row.medians[impl] = baselines[row.case.split("/")[0], row.threads, impl]
    return sorted(rows.values(), key=lambda row: (order[row.case], row.threads))


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def cells(row: Row, peak_per_core: float) -> list[str]:
    ours = row.medians["polyonnx"]
    ort, blas = row.medians.get("onnxruntime"), row.medians.get("numpy")
    ratio = [f"{ours / base:.2f}" if base else "-" for base in (ort, blas)]
    rate = row.flops / ours / 1e9 if row.flops else None
    percent = f"{100 * rate / (peak_per_core * row.threads):.0f}%" if rate else "-"
    rate_cell = f"{rate:.1f}" if rate else "-"
    return [
        row.case,
        str(row.threads),
        seconds(ours),
        seconds(ort),
        seconds(blas),
        *ratio,
        rate_cell,
        percent,
    ]


HEADER = [
    "benchmark",
    "threads",
    "polyonnx",
    "onnxruntime",
    "numpy",
    "ratio ort",
    "ratio numpy",
    "GFLOP/s",
    "% peak",
]


def print_table(rows: list[Row], peak_per_core: float) -> None:
    body = [cells(row, peak_per_core) for row in rows]
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [HEADER, *body]) for i in range(len(HEADER))]
        for i, line in enumerate([HEADER, *body]):
            left = line[0].ljust(widths[0])
            print(
                "  ".join([left] + [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)])
            )
            if i == 0:
                print("  ".join("-" * w for w in widths))
        return
    table = Table(*HEADER, box=box.SIMPLE_HEAD)
    for column in table.columns[1:]:
        column.justify = "right"
    for line in body:
        table.add_row(*line)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)


# -- the FMA peak ------------------------------------------------------------------------


def clock() -> tuple[float, str]:
    """(GHz, where it came from)."""
    path = pathlib.Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(path.read_text()) / 1e6, "sysfs cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    note = f"assumed {ASSUMED_GHZ} GHz: sysfs gives no cpufreq maximum"
    current = cpuinfo_mhz()
    if current:
        note += (
            f"; /proc/cpuinfo's {current:.0f} MHz is the current (in a VM the nominal) "
            "clock, not the boost clock an FMA loop runs at"
        )
    return ASSUMED_GHZ, note + "; override with --clock-ghz"


def cpuinfo_mhz() -> float | None:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    found = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    return float(found[1]) if found else None


def peak_per_core(ghz: float) -> tuple[float, str]:
    """fp32 GFLOP/s of one core, and how it was computed."""
    sys.path.insert(0, str(ROOT))
    from polyonnx.emit.target import host_target

    target = host_target()
    lanes = DATAPATH_BITS.get(target.name, target.vector_bits) // 32
    peak = FMA_PIPES * lanes * 2 * ghz
    how = (
        f"{target.name}, {target.vector_bits}-bit vectors: {FMA_PIPES} FMA pipes x {lanes} "
        f"fp32 lanes x 2 flops x {ghz:.2f} GHz = {peak:.1f} GFLOP/s per core"
    )
    return peak, how


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="store_true", help="run the suite first")
    parser.add_argument(
        "--json",
        type=pathlib.Path,
        default=DEFAULT_JSON,
        help=f"the pytest-benchmark JSON (default {DEFAULT_JSON})",
    )
    parser.add_argument("--clock-ghz", type=float, help="the clock the FMA peak is computed at")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]

    elapsed, others = run_suite(args.json, pytest_args) if args.run else (None, None)
    if not args.json.exists():
        sys.exit(f"{args.json} does not exist: run the suite with --run")
    data = json.loads(args.json.read_text())
    rows = table_rows(data["benchmarks"])
    ghz, source = (args.clock_ghz, "--clock-ghz") if args.clock_ghz else clock()
    peak, how = peak_per_core(ghz)

    print()
    print_table(rows, peak)
    print(f"FMA peak: {how} (clock: {source})")
    rate, impl, row = fastest(rows)
    if rate > peak:
        print(
            f"  (!) {impl} reached {rate:.1f} GFLOP/s per core on {row.case} ({row.threads}t), "
            "above that peak: a higher clock, or (Conv) padding taps counted but skipped"
        )
    blas = {b["extra_info"].get("blas_threads") for b in data["benchmarks"]} - {None}
    if blas:
        print(f"numpy's OpenBLAS threads set by: {', '.join(sorted(blas))}")
    if args.run and os.environ.get("POLYONNX_BENCH_FULL") != "1":
        print("quick suite (POLYONNX_BENCH_FULL=1 adds MatMul 2048 and 4096x64x4096)")
    if elapsed is not None:
        print(f"suite wall time: {elapsed / 60:.1f} min")
    if others is not None:
        share = f"{others:.0f} CPU-seconds ({100 * others / elapsed:.0f}% of one core)"
        print(f"other processes (or the hypervisor) used {share} during the run", end="")
        print(": 2-thread figures are not trustworthy" if others > 0.1 * elapsed else "")


def fastest(rows: list[Row]) -> tuple[float, str, Row | None]:
    """(GFLOP/s per core, implementation, row) of the fastest contraction measured."""
    rates = [
        (row.flops / t / 1e9 / row.threads, impl, row)
        for row in rows
        if row.flops
        for impl, t in row.medians.items()
    ]
    return max(rates, key=lambda rate: rate[0], default=(0.0, "", None))


if __name__ == "__main__":
    main()
