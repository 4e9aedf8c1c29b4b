"""One table of the perf/ suite: polyonnx against its baselines, measured in the same run.

    python perf/report.py --run                  # run the default suite, then print the table
    POLYONNX_BENCH_FULL=1 python perf/report.py --run    # ... with the slow cases
    python perf/report.py --json FILE            # the table of an earlier run's JSON
    python perf/report.py --run -- -k matmul     # pytest arguments after --

Columns: the polyonnx median and the baselines' (onnxruntime; numpy's OpenBLAS for
MatMul), the ratios polyonnx / baseline (< 1: polyonnx is faster) of the medians and
paired (per-round ratios of alternating rounds, polyonnx/bench/paired.py), and for
contractions polyonnx's GFLOP/s and its percent of the FMA peak of the cores it used:

    peak = threads x FMA pipes x fp32 lanes per pipe x 2 flops x clock

The pipes and lanes come from polyonnx's target (the CPU llvmlite detects), the clock from
sysfs (cpufreq's maximum); where sysfs has none, from a measured FMA loop (the clock at
which the pipes give its GFLOP/s, polyonnx/emit/fmapeak.py), as the run recorded it at
its start (``machine_info["polyonnx"]``); or give ``--clock-ghz``. A contraction's
polyonnx benchmark also runs the FMA loop right after it (perf/test_kernels.py), and its
percent is of that: in this VM the loop's rate drifted from 272.6 GFLOP/s at a run's start
to 262 minutes later, and MatMul 2048^3 read 89% of the one and 94% of the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's polyonnx, not an installed copy

from polyonnx.bench.cases import table_rows  # noqa: E402
from polyonnx.bench.peak import clock, fastest, peak_per_core  # noqa: E402
from polyonnx.bench.suite import children_cpu_seconds, cpu_busy_seconds  # noqa: E402
from polyonnx.bench.table import print_table  # noqa: E402

DEFAULT_JSON = ROOT / ".benchmarks" / "report.json"


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
    recorded = data.get("machine_info", {}).get("polyonnx", {})
    if args.clock_ghz:
        source = "--clock-ghz"
        peak, how = peak_per_core(args.clock_ghz)
    elif recorded.get("peak_gflops_per_core"):  # as the run found it (perf/conftest.py)
        peak, how = recorded["peak_gflops_per_core"], recorded["peak"]
        source = f"{recorded['clock_source']}; at the start of the run"
    else:
        ghz, source = clock()
        peak, how = peak_per_core(ghz)

    if args.clock_ghz:  # that clock for every row, not the loops run beside them
        rows = [dataclasses.replace(row, peak=None) for row in rows]
    print()
    print_table(rows, peak)
    print(f"FMA peak: {how} (clock: {source})")
    nearby = [row.peak for row in rows if row.peak]
    if nearby and not args.clock_ghz:
        print(
            f"  % peak of a contraction: of an FMA loop run right after its benchmark, "
            f"{min(nearby):.1f} to {max(nearby):.1f} GFLOP/s per core over the run"
        )
    rate, impl, row = fastest(rows)
    if row is not None and rate > (row.peak or peak):
        print(
            f"  (!) {impl} reached {rate:.1f} GFLOP/s per core on {row.case} ({row.threads}t), "
            "above that peak: a higher clock, or (Conv) padding taps counted but skipped"
        )
    blas = {b["extra_info"].get("blas_threads") for b in data["benchmarks"]} - {None}
    if blas:
        print(f"numpy's OpenBLAS threads set by: {', '.join(sorted(blas))}")
    if args.run and os.environ.get("POLYONNX_BENCH_FULL") != "1":
        print("default suite (POLYONNX_BENCH_FULL=1 adds MatMul 2048 and 4096x64x4096)")
    if elapsed is not None:
        print(f"suite wall time: {elapsed / 60:.1f} min")
    if others is not None:
        share = f"{others:.0f} CPU-seconds ({100 * others / elapsed:.0f}% of one core)"
        print(f"other processes (or the hypervisor) used {share} during the run", end="")
        print(": 2-thread figures are not trustworthy" if others > 0.1 * elapsed else "")


if __name__ == "__main__":
    main()
