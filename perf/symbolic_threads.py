"""A model with a symbolic sequence at several threads: each engine timed in a process of
its own (thread pools of two engines in one process interfere), one after the other.

    python perf/symbolic_threads.py --model M.onnx [--lengths 1,16,64,128,384] \
        [--threads 2] [--library DIR/libNAME.so]

Engines: the parametric code (one compile), code specialised to each length, onnxruntime,
and with ``--library`` the model's parametric library. Per length, each engine's median
of 7 rounds of 7 runs after a warm-up run. The inputs are perf/symbolic_sequence.py's.
Each engine runs in ``--processes`` processes, the engines taking turns: at 2 threads one
process's median varied by 10% from the next one's (docs/measurements.md, 'Two threads,
process to process'), so the figure is the median over processes, and the spread their
range.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

ENGINES = ("parametric", "specialised", "onnxruntime", "library")
ROUNDS = 7
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _sessions(engine: str, args):
    """The engine's sessions, made once for every length: the model's (which feeds are
    made from, and which runs the parametric code), and the library's or onnxruntime's."""
    from polyonnx.runtime.session import InferenceSession

    session = InferenceSession(args.model, threads=args.threads, cache=False)
    if engine == "library":
        return session, InferenceSession(args.library, threads=args.threads)
    if engine == "onnxruntime":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = args.threads
        return session, onnxruntime.InferenceSession(args.model, options)
    return session, None


def _runner(engine: str, args, sessions, length: int):
    """A function that runs ``engine`` on the inputs for ``length``."""
    from perf.symbolic_sequence import feed_for

    session, other = sessions
    feed = feed_for(session, length)
    if engine == "parametric":
        return lambda: session.run(None, feed)
    if engine == "specialised":
        from polyonnx.runtime.compiled import compile_graph

        fixed = compile_graph(session._specialised(feed))
        fixed.set_threads(args.threads)
        return lambda: fixed.run(feed)
    return lambda: other.run(None, feed)


def worker(engine: str, args) -> None:
    from perf.symbolic_sequence import median_ms

    sessions = _sessions(engine, args)
    results = {}
    for length in (int(n) for n in args.lengths.split(",")):
        run = _runner(engine, args, sessions, length)
        run()
        results[length] = statistics.median(median_ms(run) for _ in range(ROUNDS))
        del run
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--lengths", default="1,16,64,128,384")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--library", default=None)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args)
        return
    engines = [e for e in ENGINES if e != "library" or args.library]
    given = ["--model", str(pathlib.Path(args.model).resolve()), "--lengths", args.lengths,
             "--threads", str(args.threads)]  # fmt: skip
    if args.library:
        given += ["--library", str(pathlib.Path(args.library).resolve())]
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for _ in range(args.processes):
        for engine in engines:
            command = [sys.executable, "-m", "perf.symbolic_threads", "--worker", engine, *given]
            done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
            runs[engine].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"{args.model}, {args.threads} threads, each engine in {args.processes} processes of "
        "its own; ms, median over processes (their range)"
    )
    print("| length | " + " | ".join(engines) + " | par/spec | par/ort |")
    print("|---" * (len(engines) + 3) + "|")
    for length in runs["parametric"][0]:
        times = {e: [r[length] for r in runs[e]] for e in engines}
        mid = {e: statistics.median(t) for e, t in times.items()}
        cells = " | ".join(
            f"{mid[e]:.2f} ({min(times[e]):.1f}-{max(times[e]):.1f})" for e in engines
        )
        par, spec, ort = (mid[e] for e in ("parametric", "specialised", "onnxruntime"))
        print(f"| {length} | {cells} | {par / spec:.2f} | {par / ort:.2f} |")


if __name__ == "__main__":
    main()
