"""A model with a symbolic sequence compiled once (isl parameters, runtime/parametric.py)
against code specialised to each length and against onnxruntime.

    python perf/symbolic_sequence.py [--model M.onnx] [--lengths 1,16,64,128,384] \
        [--library DIR/libNAME.so]

Per length: the median latency of each engine (7 alternating rounds of 7 runs, in one
process, at --threads, 1 by default), the first call's cost over the steady latency, and
the compile counts. ``--library``: also the model's parametric library (``polyonnx
compile`` without ``--shape``), run through its C API. Symbolic dims named like a batch
("batch", "N") are fed 1. The default model is the torch dynamo export
tests/data/torch/seqencoder_dynamo.onnx.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import numpy as np

from polyonnx.runtime.compiled import compile_graph
from polyonnx.runtime.session import InferenceSession

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT = HERE.parent / "tests" / "data" / "torch" / "seqencoder_dynamo.onnx"
BATCH_NAMES = ("batch", "N", "batch_size")
ROUNDS, RUNS = 7, 7


def feed_for(session: InferenceSession, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 inputs: batch-named symbolic dims at 1, the others at ``length``."""
    rng = np.random.default_rng(seed)
    feed = {}
    for port in session.get_inputs():
        shape = [
            (1 if d in BATCH_NAMES else length) if isinstance(d, str) else d for d in port.shape
        ]
        feed[port.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def median_ms(fn) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def row(session: InferenceSession, length: int, threads: int, ort, library=None) -> dict:
    feed = feed_for(session, length)
    start = time.perf_counter()
    session.run(None, feed)
    first = time.perf_counter() - start
    start = time.perf_counter()
    fixed = compile_graph(session._specialised(feed))
    fixed.set_threads(threads)
    compile_s = time.perf_counter() - start
    engines = {
        "parametric": lambda: session.run(None, feed),
        "specialised": lambda: fixed.run(feed),
        "onnxruntime": lambda: ort.run(None, feed),
    }
    if library is not None:
        engines["library"] = lambda: library.run(None, feed)
    rounds = {name: [] for name in engines}
    for _ in range(ROUNDS):
        for name, fn in engines.items():
            rounds[name].append(median_ms(fn))
    result = {name: statistics.median(times) for name, times in rounds.items()}
    result.update(length=length, first_over=first * 1e3 - result["parametric"], compile=compile_s)
    return result


def main() -> None:
    import onnxruntime

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(DEFAULT))
    parser.add_argument("--lengths", default="1,16,64,128,384")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--library", default=None, help="the model's library, also timed")
    args = parser.parse_args()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = args.threads
    ort = onnxruntime.InferenceSession(args.model, options)
    session = InferenceSession(args.model, threads=args.threads, cache=False)
    library = args.library and InferenceSession(args.library, threads=args.threads)
    lib_head = " library | lib/ort |" if library else ""
    print(f"{args.model}, {args.threads} thread(s); ms, medians")
    print("| length | parametric | specialised | onnxruntime | par/spec | par/ort | "
          f"first call over steady | specialised compile |{lib_head}")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if library else ""))
    for length in (int(n) for n in args.lengths.split(",")):
        r = row(session, length, args.threads, ort, library or None)
        lib_cells = (
            f" {r['library']:.3f} | {r['library'] / r['onnxruntime']:.2f} |" if library else ""
        )
        print(
            f"| {length} | {r['parametric']:.3f} | {r['specialised']:.3f} | "
            f"{r['onnxruntime']:.3f} | {r['parametric'] / r['specialised']:.2f} | "
            f"{r['parametric'] / r['onnxruntime']:.2f} | {r['first_over']:.1f} ms | "
            f"{r['compile']:.2f} s |{lib_cells}"
        )
    print(f"compiles of the session: {session.compile_count}; parametric: "
          f"{session.not_parametric or 'yes'}")  # fmt: skip


if __name__ == "__main__":
    main()
