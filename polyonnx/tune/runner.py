"""Build one candidate (a kernel and a schedule trace), check it, time it — in this process.

The measurement workers (tune/worker.py) call `Bench.measure` for each job; nothing here
guards against a candidate that crashes the process: that is the worker's parent's job.

    bench = Bench(program, "conv1", threads=2)
    result = bench.measure(trace)         # Measurement(status, median_s, baseline_s, ...)

The candidate's outputs are compared with the default schedule's on the same random inputs
(seeded by the kernel's name, so every worker draws the same). Before every timed run the
caches are put in the state the model leaves them in (the rest of the model's data
written through them: `scrub_size`), and candidate and default runs alternate in short
blocks whose first run is not timed, so neither inherits a cache the other warmed. Times
come from the native per-kernel clock of a profiling build, so Python's call overhead is
not in them.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.errors import PolyonnxError, ScheduleError
from polyonnx.krnl.ir import Program
from polyonnx.runtime.compiled import CompiledModel, compile_program
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.schedule import Schedule
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.tune.tasks import kernel_program, rename_trace

MIN_SECONDS = 0.05
"""Keep timing until the repeats add up to this much kernel time ..."""
MIN_REPEATS = 8
MAX_REPEATS = 60
"""... with at least and at most this many repeats (after one warm-up run)."""
RTOL = 1e-3
"""A candidate's outputs may differ from the default's by this much relative to the
largest magnitude of the default's output (sums in another order round differently)."""


@dataclass(frozen=True)
class Measurement:
    status: str
    """"ok" or "failed"."""
    reason: str | None = None
    median_s: float | None = None
    spread_s: float | None = None
    """Interquartile range of the repeats."""
    baseline_s: float | None = None
    """The default schedule's median, timed in turn with the candidate (one run of each
    alternately), so that the ratio of the two is immune to the machine's load drifting."""
    repeats: int = 0
    compile_s: float = 0.0
    wall_s: float = 0.0
    """From the job's start in a worker to its result (tune/measure.py sets it)."""


def kernel_schedule(program: Program, kernel_name: str, trace: Sequence[Mapping]) -> KernelSchedule:
    """The kernel's schedule after replaying ``trace`` on it; [] is the default."""
    kernel = program.kernel(kernel_name)
    if not trace:
        return default_schedule(kernel, program.buffers)
    schedule = Schedule(kernel, program.buffers)
    schedule.apply(rename_trace(trace, kernel_name))
    scratch = schedule.state.scratch
    if scratch:
        raise ScheduleError("tuning traces may not add scratch buffers (pack)")
    return schedule.kernel_schedule()


class Bench:
    """One kernel of a program, compiled under different schedules and timed on fixed
    random inputs; the default schedule's outputs are the reference."""

    def __init__(self, program: Program, kernel_name: str, threads: int, scrub_bytes: int = 0):
        """``scrub_bytes``: what the rest of the model touches between two calls of this
        kernel (see `scrub_size`); before every timed run that much memory is written, so
        that the kernel finds its constants as cold as in the model (and its inputs, which
        the kernel before it just wrote, warm)."""
        self.kernel = program.kernel(kernel_name)
        self.program = kernel_program(program, self.kernel)
        self.threads = threads
        self.inputs = random_inputs(self.program, zlib.crc32(kernel_name.encode()))
        self._scrub = np.zeros(scrub_bytes, np.uint8) if scrub_bytes >= SCRUB_MIN else None
        self._reference: dict[str, np.ndarray] | None = None
        self._default: CompiledModel | None = None

    def reference(self) -> dict[str, np.ndarray]:
        if self._reference is None:
            self._default = self.compile(())
            self._reference = self._default.run(self.inputs)
        return self._reference

    def compile(self, trace: Sequence[Mapping]) -> CompiledModel:
        schedule = kernel_schedule(self.program, self.kernel.name, trace)
        compiled = compile_program(self.program, [schedule], profile=True, checks=False)
        compiled.set_threads(self.threads)
        return compiled

    def measure(self, trace: Sequence[Mapping], min_seconds: float = MIN_SECONDS) -> Measurement:
        """Build ``trace``, compare its outputs with the default's, and time it in turn
        with the default schedule; a refused, failing or wrong candidate comes back as
        a failed Measurement with the reason."""
        start = time.perf_counter()
        try:
            compiled = self.compile(trace)
        except ScheduleError as exc:
            return Measurement("failed", f"illegal: {exc}")
        except PolyonnxError as exc:
            return Measurement("failed", f"compile error: {exc}")
        compile_s = time.perf_counter() - start
        outputs = compiled.run(self.inputs)
        wrong = compare(outputs, self.reference()) if trace else None
        if wrong:
            return Measurement("failed", f"wrong answer: {wrong}", compile_s=compile_s)
        self.reference()
        contenders = [compiled, self._default] if trace else [compiled]
        times, baseline = time_runs(contenders, self.inputs, min_seconds, self._cache_state)
        q1, median, q3 = np.percentile(times, [25, 50, 75])
        return Measurement(
            "ok", None, float(median), float(q3 - q1), float(np.median(baseline or times)),
            len(times), compile_s,
        )  # fmt: skip

    def _cache_state(self) -> None:
        """The caches as the model leaves them for this kernel: the rest of the model's
        data written through them, then this kernel's inputs read (just produced)."""
        if self._scrub is None:
            return
        self._scrub[::64] += 1  # one write per cache line
        for array in self.inputs.values():
            array.sum()


SCRUB_MIN = 1 << 20
"""Less than this between two calls of a kernel leaves its data in cache: no scrubbing."""


def scrub_size(program: Program, kernel_name: str, l3_bytes: int) -> int:
    """Bytes the rest of ``program`` touches between two calls of one of its kernels (its
    constants and buffers), up to 1.5x the last-level cache (enough to evict it)."""
    kernel = program.kernel(kernel_name)
    own = set(kernel.buffers())
    other = sum(b.nbytes for n, b in program.buffers.items() if n not in own)
    return int(min(other, 1.5 * l3_bytes))


def time_runs(
    contenders: Sequence[CompiledModel], inputs, min_seconds: float, before=None
) -> tuple[list[float], list[float]]:
    """Seconds of the kernel per run, by its native clock: of the first contender, and of
    the second (if any), in alternating blocks, each run after ``before()`` (if given)."""
    times: list[list[float]] = [[] for _ in contenders]
    first = times[0]
    while len(first) < MAX_REPEATS and (len(first) < MIN_REPEATS or sum(first) < min_seconds):
        for compiled, column in zip(contenders, times, strict=True):
            for run in range(BLOCK + 1):  # the first run of a block is not timed
                if before is not None:
                    before()
                compiled.reset_profile()
                compiled.run(inputs)
                if run:
                    column.append(compiled.kernel_profile()[0].seconds)
    return first, (times[1] if len(times) > 1 else [])


BLOCK = 4
"""Timed runs of one contender in a row. The untimed run before them leaves the caches
(and, with threads, the data in each core's cache) as the contender itself leaves them:
timed right after a candidate that split a GEMM over two cores, a one-thread default
ran at a third of its speed (docs/measurements.md, 'Warm-up and quiet before a
contender's block')."""


def compare(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> str | None:
    """Why ``outputs`` are not ``reference`` (None when they match)."""
    for name, want in reference.items():
        got = outputs[name]
        if got.dtype.kind not in "fc":
            if not np.array_equal(got, want):
                bad = np.argwhere(got != want)[0]
                return (
                    f"{name}{list(bad)} is {got[tuple(bad)]}, the default gives {want[tuple(bad)]}"
                )
            continue
        if not np.array_equal(np.isnan(got), np.isnan(want)):
            return f"{name}: NaN where the default has none (or the other way round)"
        finite = ~np.isnan(want)
        scale = float(np.max(np.abs(want[finite]), initial=0.0)) or 1.0
        error = np.abs(got.astype(np.float64) - want)
        error[~finite] = 0
        worst = np.unravel_index(int(np.argmax(error)), error.shape)
        if error[worst] > RTOL * scale:
            return (
                f"{name}{list(worst)} is {got[worst]:.6g}, the default gives {want[worst]:.6g} "
                f"(error {error[worst]:.3g} > {RTOL:g} x max |output| {scale:.3g})"
            )
    return None


def random_inputs(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every input of ``program``: normal floats, small non-negative
    integers (valid indices), random booleans."""
    rng = np.random.default_rng(seed)
    return {n: _random(rng, program.buffers[n]) for n in program.inputs}


def _random(rng: np.random.Generator, buffer) -> np.ndarray:
    """Random values for a kernel's buffer. Index and divisor tensors get arbitrary ints,
    so the tuner compiles without run-time checks: it measures speed only."""
    dtype = np.dtype(buffer.dtype) if buffer.dtype != "bfloat16" else np.dtype(np.float32)
    if dtype.kind == "f":
        return rng.standard_normal(buffer.shape).astype(buffer.dtype)
    if dtype.kind == "b":
        return rng.random(buffer.shape) < 0.5
    return rng.integers(0, 4, buffer.shape).astype(dtype)
