"""``polyonnx tune``: the command line of the tuner.

    polyonnx tune MODEL [--budget 10m] [--trials N] [--db PATH] [--threads N] [--jobs N]
                        [--timeout S] [--no-resume] [--no-ort]
    polyonnx tune export [MODEL | --db PATH] [-o FILE.jsonl]
    polyonnx tune import FILE.jsonl [--db PATH]

A live table shows trials done, failures and the best speed-up so far per task; the
session ends with one table per task (each record's kernel-level speed-up, and whether
the model-level A/B kept it in use), the A/B's rounds and the records it dropped, and
as its last line the model's verdict: ``tuned model: 1.04× the default (95% CI
1.01–1.07, 40 rounds)``, or the default kept at 1.00×. Every trial is committed to the
database as it finishes: run the same command again to continue (a database that exists
is resumed).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING

from polyonnx.errors import PolyonnxError
from polyonnx.runtime.arguments import positive_int, seed_int, shape_arg, thread_arg
from polyonnx.tune.db import Database, default_path
from polyonnx.tune.session import Options, Result, TaskProgress, tune

if TYPE_CHECKING:  # rich is imported where it is used: `polyonnx profile` runs without it
    from rich.console import Console
    from rich.table import Table

SHOWN_TASKS = 10


def add_commands(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "tune",
        help="search faster schedules for a model's kernels and keep them in a database",
        description="polyonnx tune MODEL | polyonnx tune export [MODEL] | polyonnx tune "
        "import FILE (see the options)",
    )
    parser.add_argument("model", help="the .onnx model, or 'export' / 'import'")
    parser.add_argument("file", nargs="?", help="export: the model; import: the .jsonl file")
    parser.add_argument("--budget", default="10m", help="time budget: 90s, 10m, 1h (10m)")
    parser.add_argument("--trials", type=positive_int, default=None, help="stop after N trials")
    parser.add_argument(
        "--db", default=None, help="the tuning database (polyonnx-tuning.db next to the model)"
    )
    parser.add_argument(
        "--threads", type=thread_arg, default=0, help="threads to tune for (all cores)"
    )
    parser.add_argument(
        "--jobs", type=positive_int, default=1, help="candidates built and timed at once"
    )
    parser.add_argument("--timeout", type=_seconds, default=60.0, help="seconds per candidate")
    parser.add_argument(
        "--shape", type=shape_arg, action="append", default=[], metavar="NAME=D0,D1,..."
    )
    parser.add_argument("--no-ort", action="store_true", help="do not time onnxruntime")
    parser.add_argument("--seed", type=seed_int, default=0)
    parser.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=True,
        help="continue from the trials in the database (default); --no-resume searches "
        "afresh, still adding to it",
    )  # fmt: skip
    parser.add_argument("-o", "--output", help="export: write here instead of stdout")
    parser.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    """``polyonnx tune``: a session with a live table, then the report (or export/import)."""
    if args.model == "export":
        return _export(args)
    if args.model == "import":
        return _import(args)
    if not os.path.exists(args.model):
        raise FileNotFoundError(f"no model file {args.model!r}")
    options = Options(
        budget_s=parse_budget(args.budget),
        trials=args.trials,
        threads=args.threads,
        jobs=args.jobs,
        db=args.db,
        shapes=dict(args.shape) or None,
        timeout_s=args.timeout,
        seed=args.seed,
        resume=args.resume,
        compare_ort=not args.no_ort,
        fault=os.environ.get("POLYONNX_TUNE_FAULT", ""),
    )
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    if not console.is_terminal:  # a log file or a pipe: tables at full width
        console = Console(width=max(console.width, 132))
    db = options.db or str(default_path(args.model))
    resumed = " (resuming)" if os.path.exists(db) else ""
    console.print(f"tuning {args.model} for {args.budget} into {db}{resumed}")
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"), console=console,
    )  # fmt: skip
    bar = progress.add_task("trials", total=options.budget_s, status="profiling the model")
    with Live(Group(progress), console=console, refresh_per_second=4, transient=True) as live:

        def on_trial(task: TaskProgress, trial, result: Result) -> None:
            progress.update(
                bar,
                completed=min(progress.tasks[0].elapsed or 0.0, options.budget_s),
                status=f"{result.trials} trials, {result.failures} failed",
            )
            live.update(Group(progress, _live_table(result)))

        try:
            result = tune(args.model, options, on_trial)
        except KeyboardInterrupt:
            live.stop()
            console.print(
                f"interrupted: every finished trial is in {db}; run the same command to resume"
            )
            return 130
    report(result, console)
    return 0


def parse_budget(text: str) -> float:
    """Seconds in "90s", "10m", "1h" or "600"."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|)\s*", text)
    if not match:
        raise PolyonnxError(f"--budget takes a time like 90s, 10m or 1h, got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _seconds(text: str) -> float:
    """argparse's type of --timeout: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.4g}" if seconds else "-"


def _speedup(task: TaskProgress) -> str:
    return f"{task.speedup:.2f}x" if task.speedup else "-"


def _live_table(result: Result) -> Table:
    from rich.table import Table

    table = Table(title="largest tasks: best so far", title_justify="left")
    for column in (
        "kernel",
        "op",
        "share",
        "default ms",
        "best ms",
        "speed-up",
        "trials",
        "failed",
    ):
        table.add_column(column, justify="left" if column in ("kernel", "op") else "right")
    for task in [t for t in result.tasks if t.search is not None][:SHOWN_TASKS]:
        table.add_row(
            task.task.name, task.task.op_type, f"{task.share:.1%}", _ms(task.default_s),
            _ms(task.best_s), _speedup(task), str(task.trials), str(task.failures),
        )  # fmt: skip
    return table


def report(result: Result, console: Console) -> None:
    """The session's tables: per task, then the model-level A/B, the latencies, and as
    the last line the tuned model's speed-up that `run` gets."""
    console.print(_task_table(result))
    _print_untuned(result, console)
    ab_s = result.outcome.ab_s if result.outcome else 0.0
    console.print(
        f"{result.trials} trials this session ({result.failures} failed), {result.resumed} "
        f"from earlier sessions not measured again; stopped on: {result.stopped}; "
        f"{result.elapsed_s:.0f} s of the {result.budget_s:.0f} s budget, the model-level "
        f"A/B's {ab_s:.1f} s included"
    )
    if result.failures:
        console.print("failed trials are in the database with their reasons")
    names = {t.task.hash: t.task.name for t in result.tasks}
    for line in ab_lines(result, names):
        console.print(line)
    latency = result.latency
    if latency:
        line = (
            f"model latency (median, {result.key.threads} threads): default "
            f"{_ms(latency['default'])} ms, tuned {_ms(latency['tuned'])} ms"
        )
        if "onnxruntime" in latency:
            ort, ours = latency["onnxruntime"], latency["as run, beside onnxruntime"]
            line += (
                f"; timed alongside each other: onnxruntime {_ms(ort)} ms, polyonnx as it "
                f"will run {_ms(ours)} ms ({ours / ort:.2f} of onnxruntime's time)"
            )
        console.print(line)
        console.print(f"{result.applied} kernels run tuned schedules; records in {result.db}")
    for reason in result.skipped:
        console.print(f"records skipped: {reason}")
    console.print(verdict_line(result), soft_wrap=True)


def ab_lines(result: Result, names: dict[str, str]) -> list[str]:
    """The model-level A/B: each set of records tried and what it measured, then each
    record dropped and why."""
    outcome = result.outcome
    if outcome is None or outcome.decision is None:
        return ["model-level A/B: no record beat its kernel's default by the margin; "
                "the default schedules are kept"]  # fmt: skip
    decision = outcome.decision
    lines = ["model-level A/B (the default model and the tuned one, alternating rounds):"]
    for attempt in decision.attempts:
        listed = ", ".join(names.get(t, t) for t in attempt.tasks)
        kept = attempt.tasks == decision.kept
        verdict = "faster: kept" if kept else "not faster beyond the noise"
        lines.append(f"  records of {listed}: {attempt.estimate.text()}: {verdict}")
    for task, why in decision.reasons.items():
        lines.append(f"record dropped (not used by run): {names.get(task, task)}: {why}")
    return lines


def verdict_line(result: Result) -> str:
    """``tuned model: X.XX× the default (95% CI a–b, N rounds)``: the A/B of the records
    in use; never below 1, for a set that is not faster is not kept."""
    outcome = result.outcome
    final = outcome.decision.final if outcome and outcome.decision else None
    if final is None:
        return "tuned model: 1.00× the default (the default is kept: no tuned records in use)"
    return f"tuned model: {final.text().replace('×', '× the default', 1)}"


def _task_table(result: Result) -> Table:
    """Per tuned task: default and tuned time of the record the model-level A/B weighed
    (its kernel alone, against the default measured alongside it), whether the A/B kept
    it in use, and how this session's trials went."""
    from rich.table import Table

    table = Table(title=f"tuning {result.model}", title_justify="left")
    columns = ("kernel", "op", "kernels", "share", "default ms", "tuned ms", "speed-up",
               "record", "trials", "failed", "earlier", "spent s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("kernel", "op") else "right")
    for task in result.tasks:
        if task.search is None:
            continue
        speedup = f"{task.default_s / task.tuned_s:.2f}x" if task.tuned_s else "-"
        record = "in use" if task.in_use else ("dropped" if task.tuned_s else "-")
        table.add_row(
            task.task.name, task.task.op_type, str(len(task.task.kernels)), f"{task.share:.1%}",
            _ms(task.default_s), _ms(task.tuned_s), speedup, record, str(task.trials),
            str(task.failures), str(task.earlier), f"{task.spent_s:.1f}",
        )  # fmt: skip
    table.caption = (
        "speed-up: the kernel alone, against its default; record: in use where the "
        "model-level A/B kept it, dropped where the model was not faster with it"
    )
    table.caption_justify = "left"
    return table


def _print_untuned(result: Result, console: Console) -> None:
    small = [t for t in result.tasks if t.search is None and t.note.endswith("time")]
    if small:
        share = sum(t.share for t in small)
        console.print(f"not tuned: {len(small)} small tasks, {share:.1%} of the time in all")
    for task in result.tasks:
        if task.search is None and not task.note.endswith("time"):
            console.print(f"not tuned: {task.task.name} ({task.task.op_type}): {task.note}")


def _export(args: argparse.Namespace) -> int:
    path = args.db or (str(default_path(args.file)) if args.file else None)
    if path is None:
        raise PolyonnxError("tune export needs --db PATH or the model whose database to export")
    with Database(path, create=False) as db:
        if args.output:
            with open(args.output, "w") as out:
                count = db.export_jsonl(out)
        else:
            count = db.export_jsonl(sys.stdout)
    print(f"exported {count} trials from {path}", file=sys.stderr)
    return 0


def _import(args: argparse.Namespace) -> int:
    if not args.file:
        raise PolyonnxError("tune import needs the .jsonl file to read")
    path = args.db or "polyonnx-tuning.db"
    with Database(path) as db, open(args.file) as src:
        added, present = db.import_jsonl(src)
    print(f"imported {added} trials into {path} ({present} were already there)")
    return 0
