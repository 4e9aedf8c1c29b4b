"""Running the perf/ suite through pytest-benchmark.

    python -m pytest perf --benchmark-only --benchmark-json=FILE --benchmark-min-rounds=5
        [--quick] [--benchmark-autosave --benchmark-save-data --benchmark-storage=DIR]

``quick`` is perf/conftest.py's ``--quick`` subset; ``full`` sets ``POLYONNX_BENCH_FULL=1``
(the slow cases). At least 5 rounds each, so that the Mann–Whitney U test of two runs can
reach p < 0.01 (with 3 rounds against 3 it never gets below 0.1). Saving keeps the
per-round times, which that test needs.
"""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from polyonnx.errors import PolyonnxError

SUITES = ("quick", "full")
MIN_ROUNDS = 5


class BenchError(PolyonnxError):
    """The perf/ suite cannot be found or did not run."""


@dataclass(frozen=True)
class SuiteRun:
    """``seconds``: wall time; ``others``: CPU seconds other processes (or the hypervisor)
    used meanwhile, None where /proc/stat cannot tell; ``failed``: some benchmarks failed,
    the rest were measured."""

    json_path: pathlib.Path
    seconds: float
    others: float | None
    failed: bool


def source_root() -> pathlib.Path:
    """The checkout whose perf/ suite runs: polyonnx's own (an editable install), else
    the current directory."""
    for root in (pathlib.Path(__file__).resolve().parents[2], pathlib.Path.cwd()):
        if (root / "perf" / "conftest.py").is_file():
            return root
    raise BenchError(
        "the perf/ suite is not here: run polyonnx bench from a polyonnx source checkout"
    )


def command(
    suite: str,
    json_path: pathlib.Path,
    history: pathlib.Path | None,
    pytest_args: list[str],
) -> list[str]:
    """The pytest command line; ``history``: save the run there (None: do not)."""
    if suite not in SUITES:
        raise BenchError(f"unknown suite {suite!r}: expected one of {', '.join(SUITES)}")
    args = [sys.executable, "-m", "pytest", "perf", "--benchmark-only", "-q"]
    args += ["-p", "no:cacheprovider", f"--benchmark-json={json_path}"]
    args += [f"--benchmark-min-rounds={MIN_ROUNDS}", "--benchmark-columns=median,iqr,rounds"]
    if suite == "quick":
        args.append("--quick")
    if history is not None:
        args += ["--benchmark-autosave", "--benchmark-save-data"]
        args.append(f"--benchmark-storage={history.resolve()}")
    return args + pytest_args


def environment(suite: str) -> dict[str, str]:
    """The suite's environment: ours, less what would make its pytest think it is a
    pytest-xdist worker (run from one, it would then disable every benchmark)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.pop("POLYONNX_BENCH_FULL", None)
    if suite == "full":
        env["POLYONNX_BENCH_FULL"] = "1"
    return env


def run_suite(
    suite: str,
    json_path: pathlib.Path,
    history: pathlib.Path | None = None,
    pytest_args: list[str] | None = None,
) -> SuiteRun:
    """Run the suite into ``json_path`` (and save it into ``history``)."""
    root = source_root()
    args = command(suite, json_path.resolve(), history, list(pytest_args or []))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    shown = " ".join(["python", *args[1:]])
    print(f"$ {'POLYONNX_BENCH_FULL=1 ' if suite == 'full' else ''}{shown}", flush=True)
    busy, ours = cpu_busy_seconds(), children_cpu_seconds()
    start = time.perf_counter()
    code = subprocess.run(args, cwd=root, env=environment(suite)).returncode
    elapsed = time.perf_counter() - start
    if code not in (0, 1) or not json_path.exists():  # 1: some failed, the rest measured
        raise BenchError(f"the perf suite did not run: pytest exited with {code}")
    after = cpu_busy_seconds()
    others = None
    if busy is not None and after is not None:
        others = after - busy - (children_cpu_seconds() - ours)
    return SuiteRun(json_path, elapsed, others, code == 1)


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
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load_note(run: SuiteRun) -> str | None:
    """A warning when other processes used a tenth of a core or more during the run."""
    if run.others is None:
        return None
    share = f"{run.others:.0f} CPU-seconds ({100 * run.others / run.seconds:.0f}% of one core)"
    note = f"other processes (or the hypervisor) used {share} during the run"
    if run.others > 0.1 * run.seconds:
        note += ": 2-thread figures are not trustworthy"
    return note
