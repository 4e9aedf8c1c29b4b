"""Whole-model latency after tuning: the default schedules, the tuned ones (records that
beat the default) and onnxruntime, measured in the same run, a few calls of each in turn,
so that a busy moment of the machine hits all three alike.

    latency, used = model_latency("model.onnx", program, records, threads=2)
    # {"default": 0.0091, "tuned": 0.0077, "onnxruntime": 0.0071}  (median seconds)
"""

from __future__ import annotations

import time

import numpy as np

from polyonnx.krnl.ir import Program
from polyonnx.quiet import wait_until_quiet
from polyonnx.runtime.compiled import compile_program, default_schedules
from polyonnx.tune.apply import Records
from polyonnx.tune.db import Trial
from polyonnx.tune.runner import random_inputs

MIN_ROUNDS = 3
MAX_ROUNDS = 40
BLOCK = 5
SECONDS = 3.0
"""Rounds of BLOCK timed runs of each contender in turn, each block after WARM seconds
of untimed runs, continue until every contender has run this long in all (within the
bounds)."""
WARM = 0.01
"""Untimed runs of a contender before its timed block, for this long: they wake its own
worker threads. Before them, ``wait_until_quiet`` lets the last contender's threads stop
spinning: without the wait, a default schedule measured about twice as slow as itself
(docs/measurements.md, 'Warm-up and quiet before a contender's block')."""


def model_latency(
    model: str,
    program: Program,
    records: Records,
    threads: int,
    compare_ort: bool = True,
    seconds: float = SECONDS,
) -> tuple[dict[str, float], dict[str, Trial]]:
    """Median seconds per run of each contender, and the records the tuned model used."""
    feed = random_inputs(program)
    schedules, used = records.schedules(program)
    contenders = {}
    for name, chosen in (("default", default_schedules(program)), ("tuned", schedules)):
        compiled = compile_program(program, chosen)
        compiled.set_threads(threads)
        contenders[name] = lambda c=compiled: c.run(feed)
    ort = _onnxruntime(model, threads) if compare_ort else None
    if ort is not None:
        ort_feed = {k: v for k, v in feed.items() if k in {i.name for i in ort.get_inputs()}}
        contenders["onnxruntime"] = lambda: ort.run(None, ort_feed)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for run in contenders.values():
        run()  # warm-up
    rounds = 0
    while rounds < MAX_ROUNDS and (
        rounds < MIN_ROUNDS or min(sum(t) for t in times.values()) < seconds
    ):
        for name, run in contenders.items():
            wait_until_quiet()
            start = time.perf_counter()
            run()  # not timed: wakes this contender's threads
            while time.perf_counter() - start < WARM:
                run()
            for _ in range(BLOCK):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        rounds += 1
    return {name: float(np.median(t)) for name, t in times.items()}, used


def _onnxruntime(model: str, threads: int):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception:  # a model onnxruntime cannot load: report without it
        return None
