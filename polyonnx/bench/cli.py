"""``polyonnx bench`` and ``polyonnx dashboard``.

polyonnx bench [--suite quick|full] [--save] [--history DIR] [--compare REF]
               [--fail-above 5%] [--current RUN] [-k EXPR] [-- PYTEST_ARGS...]
polyonnx dashboard [--history DIR] [-o DIR] [--threshold 7.5%] [--z 3] [--window 5]

``polyonnx.cli`` registers them with ``add_commands``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import tempfile
from collections.abc import Callable

from polyonnx.bench import compare, history, levels, site, suite
from polyonnx.bench.cases import BASELINES, rows, seconds
from polyonnx.bench.table import print_table

DEFAULT_HISTORY = ".benchmarks"


def percent(text: str) -> float:
    """``5%`` or ``5`` -> 0.05."""
    try:
        value = float(text.strip().removesuffix("%")) / 100.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 5%, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive percentage, got {text!r}")
    return value


def at_least(kind: type, low: float, inclusive: bool = True) -> Callable[[str], float]:
    """An argparse type: a ``kind`` (int or float) of at least ``low`` (above it when not
    ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (value >= low if inclusive else value > low):
            bound = f"at least {low}" if inclusive else f"above {low}"
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}")
        return value

    return parse


def add_commands(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="run the perf/ suite (polyonnx against its baselines), save it, compare runs",
        description="Run the perf/ suite through pytest-benchmark; with --save, keep the run "
        "in the history; with --compare, exit 1 when a benchmark regressed against a run.",
    )
    bench.add_argument(
        "--suite",
        choices=suite.SUITES,
        default="quick",
        help="quick (about 1.5 minutes on 2 cores) or full (everything, with the slow "
        "cases); default quick",
    )
    bench.add_argument(
        "--save", action="store_true", help="save the run (with per-round times) in the history"
    )
    _history(bench)
    bench.add_argument(
        "--compare",
        metavar="REF",
        help="a run of the history: its number, a prefix of its file name or commit, "
        "'last' (the newest before this one), or a JSON file",
    )
    bench.add_argument(
        "--fail-above",
        type=percent,
        default=compare.THRESHOLD,
        metavar="PCT",
        help="with --compare: a slowdown above this (and significant) fails (default 5%%)",
    )
    _alpha(bench)
    bench.add_argument(
        "--current",
        metavar="RUN",
        help="compare this saved run (as --compare's REF) instead of running the suite",
    )
    bench.add_argument(
        "-k", dest="select", metavar="EXPR", help="only the benchmarks pytest's -k EXPR selects"
    )
    bench.add_argument(
        "pytest_args", nargs=argparse.REMAINDER, help="more pytest arguments, after --"
    )
    bench.set_defaults(handler=cmd_bench)

    dashboard = sub.add_parser(
        "dashboard",
        help="write a static site of the history: trends, baselines, regressions",
        description="Write the history as a static site that works offline.",
    )
    _history(dashboard)
    dashboard.add_argument(
        "-o",
        "--output",
        type=pathlib.Path,
        help="where to write the site (default HISTORY/dashboard)",
    )
    dashboard.add_argument(
        "--threshold",
        type=percent,
        default=levels.THRESHOLD,
        metavar="PCT",
        help="flag changes of at least this against the level (default 7.5%%)",
    )
    dashboard.add_argument(
        "--z",
        type=at_least(float, 0.0, inclusive=False),
        default=levels.Z_MIN,
        help="and of at least this many times their noise (default 3)",
    )
    dashboard.add_argument(
        "--window",
        type=at_least(int, 2),
        default=levels.WINDOW,
        help="the runs that set a level, at least 2 (default 5)",
    )
    dashboard.set_defaults(handler=cmd_dashboard)


# ---- bench -----------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    runs, skipped = history.load_history(args.history)
    for note in skipped:
        print(f"skipped: {note}", file=sys.stderr)
    failed = False
    if args.current and not args.compare:
        raise suite.BenchError("--current RUN goes with --compare REF")
    if args.current:
        current = history.find_run(runs, args.current)
    else:
        current, saved, failed = run_and_save(args)
        runs = [run for run in runs if saved is None or run.path.resolve() != saved.resolve()]
    if not args.compare:
        return 1 if failed else 0
    others = [run for run in runs if run.path.resolve() != current.path.resolve()]
    if args.compare == "last":  # the newest run before the current one
        others = [run for run in others if run.datetime < current.datetime]
    reference = history.find_run(others, args.compare, current.machine)
    regressed = print_comparison(reference, current, args.fail_above, args.alpha)
    return 1 if regressed or failed else 0


def run_and_save(args: argparse.Namespace) -> tuple[history.Run, pathlib.Path | None, bool]:
    """Run the suite; (the run, the file it was saved in or None, whether some failed)."""
    pytest_args = [a for a in args.pytest_args if a != "--"]
    if args.select:
        pytest_args = ["-k", args.select, *pytest_args]
    before = set(history.run_files(args.history)) if args.history.is_dir() else set()
    with tempfile.TemporaryDirectory(prefix="polyonnx-bench-") as tmp:
        result = suite.run_suite(
            args.suite,
            pathlib.Path(tmp) / "run.json",
            args.history if args.save else None,
            pytest_args,
        )
        current = history.read_run(result.json_path)
    print()
    print_table(rows(list(current.measurements)), current.peak)
    count = len(current.measurements)
    print(
        f"{args.suite} suite: {count} benchmarks in {result.seconds:.0f} s wall "
        f"({result.seconds / 60:.1f} min)"
    )
    note = suite.load_note(result)
    if note:
        print(note)
    if result.failed:
        print("(!) some benchmarks failed: the run has the ones measured", file=sys.stderr)
    saved = None
    if args.save:
        new = sorted(set(history.run_files(args.history)) - before)
        saved = new[-1] if new else None
        if saved is None:
            raise suite.BenchError(f"pytest-benchmark saved no run into {args.history}")
        print(f"saved: {saved}")
    current = dataclasses.replace(current, path=saved or current.path)
    return current, saved, result.failed


def print_comparison(
    reference: history.Run, current: history.Run, threshold: float, alpha: float
) -> bool:
    """Print the regressions and improvements of ``current`` against ``reference``;
    whether any regressed."""
    changes = compare.compare_runs(reference, current, threshold, alpha)
    print(
        f"\ncompared with run {reference.label} ({reference.path.name}): {len(changes)} "
        f"benchmarks, threshold {threshold:.0%}, alpha {alpha:g}"
    )
    if reference.machine != current.machine:
        print(f"(!) different machines: {reference.machine.label} and {current.machine.label}")
    for kind in ("regression", "improvement"):
        found = [c for c in changes if c.verdict.kind == kind]
        print(f"{kind}s: {len(found) or 'none'}")
        for change in found:
            print(f"  {describe_change(change)}")
    ours = {(m.case, m.threads) for m in current.measurements if m.impl == "polyonnx"}
    missing = sorted(
        f"{m.case} {m.threads}t"
        for m in reference.measurements
        if m.impl == "polyonnx" and (m.case, m.threads) not in ours
    )
    if missing:
        print(f"not in this run ({len(missing)}): {', '.join(missing)}")
    return any(c.verdict.kind == "regression" for c in changes)


def describe_change(change: compare.Change) -> str:
    verdict = change.verdict
    text = (
        f"{change.case} {change.threads}t: {seconds(change.before.median)} -> "
        f"{seconds(change.after.median)} ({verdict.change:+.1%}, {verdict.p_text})"
    )
    for impl in BASELINES:
        if impl in change.baselines:
            old, new = change.baselines[impl]
            text += f"; {impl} {seconds(old)} -> {seconds(new)} ({new / old - 1:+.1%})"
    return text


# ---- dashboard -------------------------------------------------------------------------


def cmd_dashboard(args: argparse.Namespace) -> int:
    if not args.history.is_dir():
        raise history.HistoryError(
            f"{args.history} is not a directory: save runs first with polyonnx bench --save"
        )
    runs, skipped = history.load_history(args.history)
    for note in skipped:
        print(f"skipped: {note}", file=sys.stderr)
    out = args.output or args.history / "dashboard"
    settings = levels.Settings(args.threshold, args.z, args.window)
    pages = site.write_site(runs, out, settings)
    machines = len({run.machine for run in runs})
    print(
        f"{len(runs)} runs of {machines} machine{'s' * (machines != 1)}: "
        f"wrote {len(pages)} page{'s' * (len(pages) != 1)} into {out}"
    )
    if not runs:
        print("no saved runs yet: polyonnx bench --save (twice or more to see trends)")
    print(f"open {pages[0].resolve().as_uri()}")
    return 0


def _alpha(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--alpha",
        type=float,
        default=compare.ALPHA,
        help="significance level of the Mann-Whitney U test (default 0.01)",
    )


def _history(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--history",
        type=pathlib.Path,
        default=pathlib.Path(DEFAULT_HISTORY),
        help=f"the history directory (default {DEFAULT_HISTORY})",
    )
