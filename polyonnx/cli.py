"""The ``polyonnx`` command.

polyonnx run MODEL [--input NAME=FILE.npy ...] [--shape NAME=1,3,224,224 ...]
                   [--compare-ort] [--repeat N] [--threads N] [--db PATH] [--no-tuning]
polyonnx show MODEL [--kernel NAME] [--llvm] [--shape NAME=...]
polyonnx profile MODEL [--threads N] [--runs R] [--top K] [--input ...] [--shape ...]
polyonnx tune MODEL [--budget 10m] [--trials N] [--db PATH] [--threads N] [--jobs N]
polyonnx tune export|import ...                       (polyonnx/tune/cli.py)
polyonnx bench [--suite quick|full] [--save] [--compare REF]   (polyonnx/bench/cli.py)
polyonnx dashboard [--history DIR] [-o DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from polyonnx.errors import ArgumentError, PolyonnxError
from polyonnx.runtime.arguments import positive_int, seed_int, shape_arg, thread_arg

if TYPE_CHECKING:
    from polyonnx.runtime.compiled import KernelProfile


def main(argv: Sequence[str] | None = None) -> int:
    """The exit code: 0, 2 for a bad argument or a PolyonnxError (one line on stderr, no
    traceback), 130 on Ctrl-C. Any other exception is a bug and keeps its traceback."""
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exc:  # argparse has printed usage and the error (or --help)
            return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
        return args.handler(args)
    except KeyboardInterrupt:
        return 130
    except (PolyonnxError, FileNotFoundError) as exc:
        print(f"polyonnx: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2


def _one_line(text: str) -> str:
    """A multi-line message (an UnsupportedOpError's list) as one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return "".join(lines)
    return f"{lines[0]} {'; '.join(lines[1:])}"


def input_arg(text: str) -> tuple[str, str]:
    """argparse's type of --input NAME=FILE.npy: the file must exist."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got {text!r}")
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no such file {path!r} (in {text!r})")
    return name, path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polyonnx", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="compile a model, run it, and report outputs and latency")
    run.add_argument("model")
    run.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy", type=input_arg
    )
    run.add_argument(
        "--shape", action="append", default=[], metavar="NAME=D0,D1,...", type=shape_arg,
        help="concrete shape for an input with symbolic dims",
    )  # fmt: skip
    run.add_argument("--compare-ort", action="store_true", help="compare outputs with onnxruntime")
    run.add_argument("--repeat", type=positive_int, default=20, help="timed runs (median reported)")
    run.add_argument("--threads", type=thread_arg, default=None)
    run.add_argument("--seed", type=seed_int, default=0)
    run.add_argument(
        "--db", help="tuning records to use (default: polyonnx-tuning.db next to the model)"
    )
    run.add_argument("--no-tuning", action="store_true", help="default schedules only")
    run.add_argument("--no-cache", action="store_true", help="compile, not load from the cache")
    run.add_argument(
        "--no-checks", action="store_true",
        help="compile out the run-time index and divisor checks (docs/ops.md)",
    )  # fmt: skip
    run.set_defaults(handler=cmd_run)

    build = sub.add_parser(
        "compile", help="compile a model into a shared library with a C API (docs/deploy.md)"
    )
    build.add_argument("model")
    build.add_argument("-o", "--output", required=True, metavar="DIR")
    build.add_argument("--name", help="prefix of the library's symbols (default: the model's)")
    build.add_argument("--target", help="LLVM triple, e.g. aarch64-linux-gnu (default: host)")
    build.add_argument("--cpu", help="CPU to tune code for, e.g. neoverse-n1, haswell, x86-64")
    build.add_argument(
        "--threads", type=thread_arg, default=None,
        help="threads the tuning records are for, and NAME_open(0)'s default",
    )  # fmt: skip
    build.add_argument("--db", help="tuning records (default: polyonnx-tuning.db by the model)")
    build.add_argument("--no-tuning", action="store_true", help="default schedules only")
    build.add_argument(
        "--shape", action="append", default=[], metavar="NAME=D0,D1,...", type=shape_arg
    )
    build.add_argument(
        "--no-checks", action="store_true",
        help="compile out the run-time index and divisor checks (docs/ops.md)",
    )  # fmt: skip
    build.set_defaults(handler=cmd_compile)

    cache = sub.add_parser("cache", help="the compile cache: info, or clear it")
    cache.add_argument("action", choices=["info", "clear"])
    cache.set_defaults(handler=cmd_cache)

    show = sub.add_parser("show", help="print kernels: isl domains, accesses and loop nests")
    show.add_argument("model")
    show.add_argument("--kernel", help="only this kernel (an ONNX node name)")
    show.add_argument("--llvm", action="store_true", help="also print the optimised LLVM IR")
    show.add_argument(
        "--shape", action="append", default=[], metavar="NAME=D0,D1,...", type=shape_arg
    )
    show.set_defaults(handler=cmd_show)

    profile = sub.add_parser(
        "profile", help="time every kernel of a model and print the slowest first"
    )
    profile.add_argument("model")
    profile.add_argument("--threads", type=thread_arg, default=None)
    profile.add_argument(
        "--runs", type=positive_int, default=10, help="timed runs (after one warm-up)"
    )
    profile.add_argument("--top", type=positive_int, default=20, help="show the K slowest kernels")
    profile.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy", type=input_arg
    )
    profile.add_argument(
        "--shape", action="append", default=[], metavar="NAME=D0,D1,...", type=shape_arg
    )
    profile.add_argument("--seed", type=seed_int, default=0)
    profile.set_defaults(handler=cmd_profile)

    from polyonnx.bench.cli import add_commands as add_bench_commands
    from polyonnx.tune.cli import add_commands as add_tune_commands

    add_tune_commands(sub)
    add_bench_commands(sub)
    return parser


# ---- run -------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from polyonnx.inference import InferenceSession

    start = time.perf_counter()
    session = InferenceSession(
        args.model,
        threads=args.threads,
        tuning_db=_tuning_db(args),
        cache=False if args.no_cache else None,
        checks=not args.no_checks,
    )
    feed = _inputs(session, args)
    compiled = session.runner_for(feed)
    compile_s = time.perf_counter() - start
    if args.compare_ort and session.graph is None:
        raise PolyonnxError("--compare-ort needs the .onnx model, not a compiled library")
    outputs = session.run(None, feed)
    names = [o.name for o in session.get_outputs()]
    reference, rerun = (
        _onnxruntime(args.model, feed, args.threads) if args.compare_ort else (None, None)
    )
    print(f"model    {args.model}")
    print(f"compile  {compile_s * 1e3:.1f} ms{_compiled_how(session, compiled)}")
    if compiled.tuned:
        print(f"tuned    {len(compiled.tuned)} of {_kernel_count(compiled)} kernels from records")
    for reason in session.records.skipped if session.records else ():
        print(f"records skipped: {reason}")
    for name, array in feed.items():
        print(f"input    {name}: {array.dtype} {list(array.shape)}")
    for i, (name, array) in enumerate(zip(names, outputs, strict=True)):
        line = f"output   {name}: {array.dtype} {list(array.shape)}"
        if reference is not None:
            line += "  " + _error_text(array, reference[i])
        print(line)
    if compiled.memory() is not None:
        print(f"memory   {_memory_text(compiled.memory())}")
    latency = _median_latency(lambda: session.run(None, feed), args.repeat)
    print(f"latency  {latency * 1e3:.3f} ms (median of {args.repeat})")
    if reference is not None:
        ort_latency = _median_latency(rerun, args.repeat)
        print(f"onnxruntime latency  {ort_latency * 1e3:.3f} ms (median of {args.repeat})")
    return 0


def _kernel_count(compiled) -> int:
    from polyonnx.runtime.parametric import ParametricModel

    if isinstance(compiled, ParametricModel):
        return len(compiled.schedules)
    return len(compiled.abi.kernels)


def _compiled_how(session, compiled) -> str:
    if session.graph is None:
        return " (a compiled library: loaded, nothing compiled)"
    plan = getattr(compiled, "plan", None)
    if plan is not None:
        return f" (one sample's code, for any {plan.symbol!r}: runtime/blocks.py)"
    from polyonnx.runtime.parametric import ParametricModel

    if isinstance(compiled, ParametricModel):
        names = ", ".join(repr(s) for s in compiled.symbols)
        return f" (once, for any {names}: isl parameters, runtime/parametric.py)"
    if getattr(compiled, "cached", False):
        return " (loaded from the compile cache: polyonnx cache info)"
    return ""


def cmd_compile(args: argparse.Namespace) -> int:
    from polyonnx.inference import load_records
    from polyonnx.runtime.library import compile_library, default_name
    from polyonnx.target import make_target

    start = time.perf_counter()
    target = make_target(args.target, args.cpu)
    _output_directory(args.output)
    threads = args.threads or 1
    tuning = _tuning_db(args)
    records = None if tuning is False else load_records(tuning, threads)
    shapes = _shapes(args)
    name = args.name or default_name(args.model)
    library = compile_library(
        args.model, args.output, name, target=target, records=records,
        input_shapes=shapes or None, default_threads=args.threads or 0,
        checks=not args.no_checks,
    )  # fmt: skip
    print(f"model    {args.model}")
    print(f"target   {target.triple} {target.name} ({target.vector_bits}-bit vectors)")
    print(f"compile  {time.perf_counter() - start:.1f} s")
    for path in (library.library, library.header, library.weights):
        if path is not None:
            print(f"wrote    {path} ({path.stat().st_size / 2**20:.2f} MB)")
    return 0


def _output_directory(path: str) -> None:
    """Create -o DIR, or say why it cannot be (a file is there, no permission)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ArgumentError(f"-o {path!r}: cannot create the directory: {exc}") from None


def _shapes(args: argparse.Namespace) -> dict[str, list[int]]:
    """--shape NAME=D0,D1,... given (parsed by shape_arg), by input name."""
    return _by_name(args.shape, "--shape")


def _by_name(pairs: Sequence[tuple[str, object]], flag: str) -> dict:
    """``pairs`` as a dict; an input named twice is an error, not the last one winning."""
    found: dict = {}
    for name, value in pairs:
        if name in found:
            raise ArgumentError(f"{flag} names input {name!r} twice")
        found[name] = value
    return found


def cmd_cache(args: argparse.Namespace) -> int:
    from polyonnx.runtime.cache import CompileCache, enabled_by_default

    cache = CompileCache()
    if args.action == "clear":
        print(f"removed  {cache.clear()} entries from {cache.directory}")
        return 0
    info = cache.info()
    state = "on" if enabled_by_default() else "off (POLYONNX_CACHE)"
    print(f"cache    {info.directory} ({state})")
    print(
        f"entries  {info.entries}, {info.bytes / 2**20:.1f} MB of {info.cap_bytes / 2**20:.0f} MB"
    )
    return 0


def _memory_text(use) -> str:
    def mb(n: int) -> str:
        return f"{n / 2**20:.2f} MB"

    text = f"intermediates {mb(use.arena)} (at least {mb(use.lower_bound)} live at once)"
    text += f", constants {mb(use.constants)}"
    if use.panels:
        text += f" ({mb(use.panels)} of them weights packed for GEMMs when compiling)"
    return text


def _tuning_db(args: argparse.Namespace):
    """The records ``run`` uses: --db, else the database ``polyonnx tune`` writes next to
    the model (if there is one); False with --no-tuning."""
    if args.no_tuning:
        return False
    if args.db:
        return args.db
    from polyonnx.tune.db import default_path

    path = default_path(args.model)
    return str(path) if path.exists() else None


MAX_RANDOM_BYTES = 2**31
"""The largest random input the CLI makes for an input without --input: past it, the
user surely mistyped a --shape (a file given with --input has no cap)."""


def _inputs(session, args: argparse.Namespace) -> dict[str, np.ndarray]:
    """--input files, and random arrays for the other inputs (of --shape's shape, else the
    declared one with symbolic dims 1), checked against the model before any is made."""
    given = _by_name(args.input, "--input")
    shapes = _shapes(args)
    known = [arg.name for arg in session.get_inputs()]
    for flag, names in (("--input", given), ("--shape", shapes)):
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ArgumentError(f"{flag} names {unknown}, which are not inputs of {known}")
    rng = np.random.default_rng(args.seed)
    feed = {}
    for arg in session.get_inputs():
        if arg.name in given:
            feed[arg.name] = _load_array(arg.name, given[arg.name])
            continue
        value = session.input_values[arg.name]
        shape = shapes.get(arg.name)
        if shape is None:
            shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        _check_random_shape(value, shape)
        feed[arg.name] = _random(rng, value.dtype, shape)
    return feed


def _load_array(name: str, path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ArgumentError(f"--input {name}={path}: not a readable .npy array: {exc}") from None


def _check_random_shape(value, shape: list[int]) -> None:
    """--shape's shape against the declared one (rank, static dims) and MAX_RANDOM_BYTES."""
    declared = list(value.shape)
    if len(shape) != len(declared) or any(
        isinstance(d, int) and d != s for d, s in zip(declared, shape, strict=True)
    ):
        raise ArgumentError(
            f"--shape {value.name}={','.join(map(str, shape))} does not fit the input's "
            f"declared shape {declared}"
        )
    nbytes = np.dtype(value.dtype).itemsize * int(np.prod(shape, dtype=object))
    if nbytes > MAX_RANDOM_BYTES:
        raise ArgumentError(
            f"input {value.name!r} of shape {shape} would be {nbytes / 2**30:.1f} GiB of random "
            f"data (at most {MAX_RANDOM_BYTES / 2**30:.0f} GiB); give it with --input FILE.npy"
        )


def _random(rng: np.random.Generator, dtype: str, shape: list[int]) -> np.ndarray:
    """A random input. Integers are 0 or 1: a valid mask, token type or index into any
    dim of 2 or more (run-time checks refuse an index out of range: docs/ops.md)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _onnxruntime(model: str, feed: dict[str, np.ndarray], threads: int | None):
    """onnxruntime's outputs for ``feed`` and a function that runs it again (for timing)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise PolyonnxError("--compare-ort needs onnxruntime: pip install onnxruntime") from exc
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        outputs = session.run(None, feed)
    except Exception as exc:  # onnxruntime refuses what polyonnx ran: report, not crash
        raise PolyonnxError(f"--compare-ort: onnxruntime could not run the model: {exc}") from exc
    return outputs, lambda: session.run(None, feed)


def _error_text(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"SHAPE MISMATCH vs onnxruntime {list(want.shape)}"
    if got.size == 0:
        return "max abs err 0 (empty)"
    got, want = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(want)
    if not np.array_equal(np.isnan(got), nan):
        here, there = int(np.isnan(got).sum()), int(nan.sum())
        return f"NaN in other places: {here} here, {there} in onnxruntime's output"
    note = f"; NaN in the same {int(nan.sum())} places" if nan.any() else ""
    if nan.all():
        return f"max abs err 0 (vs onnxruntime{note})"
    diff = np.abs(got[~nan] - want[~nan])
    rel = diff / np.maximum(np.abs(want[~nan]), 1e-30)
    return f"max abs err {diff.max():.3g}  max rel err {rel.max():.3g} (vs onnxruntime{note})"


def _median_latency(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(max(repeat, 1)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# ---- profile ---------------------------------------------------------------------------

CONTRACTION_OPS = frozenset({"MatMul", "Gemm", "Conv"})
"""Ops whose GFLOP/s the profile shows (2 * multiply-adds per second)."""

PROFILE_COLUMNS = ("#", "kernel", "op", "ms/run", "% model", "GFLOP/s")


def cmd_profile(args: argparse.Namespace) -> int:
    from polyonnx.inference import InferenceSession

    start = time.perf_counter()
    session = InferenceSession(args.model, threads=args.threads, profile=True)
    feed = _inputs(session, args)
    session.run(None, feed)  # compiles (if shapes are dynamic) and warms up
    compile_s = time.perf_counter() - start
    session.reset_profile()
    start = time.perf_counter()
    for _ in range(args.runs):
        session.run(None, feed)
    wall = (time.perf_counter() - start) / args.runs
    records = sorted(session.kernel_profile(), key=lambda r: r.seconds, reverse=True)
    kernel_s = sum(r.seconds for r in records) / args.runs
    print(f"model    {args.model}")
    print(f"threads  {session.threads}, {args.runs} runs after 1 warm-up")
    print(f"compile  {compile_s * 1e3:.1f} ms (with the warm-up run, which is not counted)")
    print(
        f"latency  {wall * 1e3:.3f} ms per run ({kernel_s * 1e3:.3f} ms in {len(records)} kernels)"
    )
    _print_table(_profile_rows(records[: args.top], args.runs), PROFILE_COLUMNS)
    rest = records[args.top :]
    if rest:
        rest_ms = sum(r.seconds for r in rest) / args.runs * 1e3
        share = sum(r.share for r in rest) * 100
        kernels = "kernel" if len(rest) == 1 else "kernels"
        print(f"... {len(rest)} more {kernels}: {rest_ms:.3f} ms/run, {share:.1f}% of the model")
    return 0


def _profile_rows(records: Sequence[KernelProfile], runs: int) -> list[tuple[str, ...]]:
    rows = []
    for rank, record in enumerate(records, 1):
        gflops = record.gflops if record.op_type in CONTRACTION_OPS else None
        rows.append(
            (
                str(rank),
                record.kernel,
                record.op_type,
                f"{record.seconds / runs * 1e3:.3f}",
                f"{record.share * 100:.1f}",
                "" if gflops is None else f"{gflops:.1f}",
            )
        )
    return rows


TEXT_COLUMNS = frozenset({"kernel", "op"})
"""Left-aligned; the others are numbers, right-aligned."""


def _print_table(rows: Sequence[tuple[str, ...]], columns: Sequence[str]) -> None:
    """With rich if it is installed, else as aligned plain text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(_plain_table(rows, columns))
        return
    table = Table()
    for column in columns:
        justify = "left" if column in TEXT_COLUMNS else "right"
        table.add_column(column, justify=justify, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:  # piped or captured: never wrap to 80 columns
        console = Console(width=max(console.width, 200))
    console.print(table)


def _plain_table(rows: Sequence[tuple[str, ...]], columns: Sequence[str]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(width) if column in TEXT_COLUMNS else cell.rjust(width)
            for cell, width, column in zip(cells, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in rows])


# ---- show ------------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    from polyonnx.krnl.ir import loads
    from polyonnx.runtime.compiled import compile_program, default_schedules, lower_model
    from polyonnx.schedule.pseudo_c import pseudo_c

    shapes = _shapes(args)
    program = lower_model(args.model, shapes or None)
    schedules = default_schedules(program)
    chosen = [s for s in schedules if args.kernel in (None, s.kernel.name)]
    if not chosen:
        known = ", ".join(s.kernel.name for s in schedules)
        raise PolyonnxError(f"no kernel named {args.kernel!r}; kernels are: {known}")
    compiled = compile_program(program, schedules) if args.llvm else None
    for schedule in chosen:
        kernel = schedule.kernel
        print(f"=== kernel {kernel.name} ({kernel.op_type}) ===")
        for stmt in kernel.statements:
            reduce = f"  [reduce {stmt.reduce}]" if stmt.reduce else ""
            print(f"{stmt.name}: domain {stmt.domain}{reduce}")
            print(f"    write {stmt.write.buffer}: {stmt.write.index}")
            for load in dict.fromkeys(loads(stmt.expr)):
                print(f"    read  {load.access.buffer}: {load.access.index}")
        print("loop nest:")
        print(_indent(pseudo_c(schedule, dict(program.buffers))))
        if args.llvm:
            symbol = compiled.symbols[schedules.index(schedule)]
            print(f"LLVM IR (optimised, function {symbol}):")
            print(_indent(_function_ir(compiled.jit.optimized, symbol)))
        print()
    return 0


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _function_ir(module_text: str, symbol: str) -> str:
    """The kernel's function and the functions it made (``symbol.gemm0``, ``symbol.par3``:
    a GEMM, an outlined parallel loop)."""
    lines = module_text.splitlines()
    found = []
    for start, line in enumerate(lines):
        name = line.replace('"', "")
        if line.startswith("define") and (f"@{symbol}(" in name or f"@{symbol}." in name):
            end = next(i for i in range(start, len(lines)) if lines[i] == "}")
            found.append("\n".join(lines[start : end + 1]))
    if not found:
        return f"(kernel function {symbol} was inlined into the entry by the optimiser)"
    return "\n\n".join(found)


if __name__ == "__main__":
    sys.exit(main())
