"""The end of a tuning session: the model-level A/B decides which records `run` uses
(tune/verdict.py), the verdicts go to the database, and onnxruntime is timed beside the
model as it will run.

    outcome = evaluate(Setup(model, program, db, key, shares, session), deadline)
    outcome.decision.kept     # the tasks whose records stay in use
    outcome.latency           # {"default": 0.0091, "tuned": 0.0077, "onnxruntime": 0.0071}

The candidates are the records `Records` loads with ``candidates=True`` (every record
not dropped that beats its default by the margin): the set ``polyonnx run`` would use if
the A/B kept them all. Each set tried is compiled once; the default model once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from polyonnx.errors import PolyonnxError
from polyonnx.krnl.ir import Program
from polyonnx.quiet import wait_until_quiet
from polyonnx.runtime.compiled import CompiledModel, compile_program, default_schedules
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.tune.apply import Choice, Records
from polyonnx.tune.db import Database, Key, Trial, Verdict
from polyonnx.tune.runner import random_inputs
from polyonnx.tune.verdict import (
    MIN_ROUNDS,
    Attempt,
    Decision,
    Estimate,
    Record,
    calls_per_block,
    decide,
    paired_rounds,
    timer,
)

MIN_ROUNDS_LATENCY = 3
MAX_ROUNDS_LATENCY = 40
BLOCK = 5
SECONDS = 3.0
"""onnxruntime beside the model as run: rounds of BLOCK timed runs of each in turn, each
block after WARM seconds of untimed runs, until each has run this long (within the
bounds)."""
WARM = 0.01
"""Untimed runs of a contender before its timed block, for this long: they wake its own
worker threads. Before them, ``wait_until_quiet`` lets the last contender's threads stop
spinning: without the wait, a default schedule measured about twice as slow as itself
(docs/measurements.md, 'Warm-up and quiet before a contender's block')."""


@dataclass(frozen=True)
class Setup:
    """What the end of a session works on: the model, its program, the database, the
    key (threads included), each task's share of the model's time, the session's id."""

    model: str
    program: Program
    db: str
    key: Key
    shares: Mapping[str, float]
    session: str = ""
    compare_ort: bool = True
    eval_s: float = SECONDS


@dataclass
class Outcome:
    """The A/B's decision (None: no record to weigh), the candidates weighed (by task),
    the records in use after it (by kernel), latencies, and the A/B's wall seconds."""

    decision: Decision | None = None
    candidates: dict[str, Choice] = field(default_factory=dict)
    used: dict[str, Trial] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    ab_s: float = 0.0
    skipped: list[str] = field(default_factory=list)


def evaluate(setup: Setup, deadline: float) -> Outcome:
    """Weigh the candidate records with the A/B until ``deadline`` (time.monotonic; the
    first A/B runs its minimum rounds whatever the time), write the verdicts, time
    onnxruntime beside the model as it will run."""
    start = time.monotonic()
    program, threads = setup.program, setup.key.threads
    records = Records.load(threads, setup.db, candidates=True)
    try:
        defaults = default_schedules(program)
        tuned, used = records.schedules(program, defaults)
        outcome = Outcome(skipped=list(records.skipped))
        outcome.candidates = records.choices({trial.task for trial in used.values()})
    finally:
        records.close()
    feed = random_inputs(program)
    default_model = _compiled(program, defaults, threads)
    run_default = _runner(default_model, feed)
    final = run_default
    if outcome.candidates:
        builder = _Builder(program, defaults, tuned, used, threads, feed)
        ab = _AB(run_default, builder, deadline)
        weighed = _weights(outcome.candidates, used, setup.shares)
        outcome.decision = decide(weighed, ab, ab.time_left)
        kept = set(outcome.decision.kept)
        outcome.used = {k: t for k, t in used.items() if t.task in kept}
        if kept:
            final = builder.run(outcome.decision.kept)
    _judge(setup, outcome)
    outcome.ab_s = time.monotonic() - start
    outcome.latency = _latency(setup, outcome.decision, final)
    return outcome


def _compiled(
    program: Program, schedules: list[KernelSchedule] | tuple, threads: int
) -> CompiledModel:
    compiled = compile_program(program, schedules, checks=False)
    compiled.set_threads(threads)
    return compiled


def _runner(compiled: CompiledModel, feed: Mapping[str, np.ndarray]) -> Callable[[], object]:
    return lambda: compiled.run(feed)


class _Builder:
    """The tuned model for a set of tasks (their kernels tuned, the others default),
    compiled once per set."""

    def __init__(self, program, defaults, tuned, used, threads, feed):  # fmt: skip
        self.program, self.defaults, self.tuned = program, defaults, tuned
        self.tasks = [used[k.name].task if k.name in used else None for k in program.kernels]
        self.threads, self.feed = threads, feed
        self._runs: dict[tuple[str, ...], Callable[[], object]] = {}

    def run(self, tasks: tuple[str, ...]) -> Callable[[], object]:
        if tasks not in self._runs:
            chosen = set(tasks)
            schedules = [
                tuned if task in chosen else default
                for tuned, default, task in zip(self.tuned, self.defaults, self.tasks, strict=True)
            ]
            self._runs[tasks] = _runner(_compiled(self.program, schedules, self.threads), self.feed)
        return self._runs[tasks]


class _AB:
    """``measure`` for `decide`: the default model against the tuned one for a set of
    tasks, in paired rounds; ``time_left``: whether another A/B (its compile and its
    minimum rounds, as long as the last ones took) fits before the deadline."""

    def __init__(self, run_default: Callable[[], object], builder: _Builder, deadline: float):
        self.run_default, self.builder, self.deadline = run_default, builder, deadline
        self.calls = calls_per_block(run_default)
        self.threads = builder.threads
        self.cost = 0.0
        """Seconds the last A/B took to compile and run its first MIN_ROUNDS rounds."""

    def __call__(self, tasks: tuple[str, ...]) -> Estimate:
        start = time.monotonic()
        try:
            run_tuned = self.builder.run(tasks)
            calls_per_block(run_tuned)  # warm-up
        except PolyonnxError as exc:  # a record that builds alone but not in the model
            return Estimate.failed(f"the tuned model failed: {exc}")
        compiled = time.monotonic()
        result = paired_rounds(
            timer(self.run_default, self.calls, self.threads),
            timer(run_tuned, self.calls, self.threads),
            self.deadline,
        )
        per_round = (time.monotonic() - compiled) / result.rounds
        self.cost = compiled - start + MIN_ROUNDS * per_round
        return result

    def time_left(self) -> bool:
        return time.monotonic() + self.cost < self.deadline


def _weights(
    candidates: Mapping[str, Choice], used: Mapping[str, Trial], shares: Mapping[str, float]
) -> list[Record]:
    """The candidates with their expected gains, named by a kernel that runs each."""
    names = {}
    for kernel, trial in used.items():
        names.setdefault(trial.task, kernel)
    return [
        Record(task, names[task], shares.get(task, 0.0) * (1 - c.trial.ratio(c.default)))
        for task, c in candidates.items()
    ]


def _judge(setup: Setup, outcome: Outcome) -> None:
    """The verdicts into the database: every candidate kept or dropped with its reason;
    every other tuned trace of the model's tasks pending (not used)."""
    verdicts = []
    decision = outcome.decision
    for task, choice in outcome.candidates.items():
        if decision is not None and task in decision.kept:
            why = f"kept: the model with {len(decision.kept)} record(s) ran {decision.final.text()}"
            verdicts.append(Verdict(choice.trial, "kept", why, choice.default))
        else:
            why = decision.reasons.get(task, "") if decision else ""
            verdicts.append(Verdict(choice.trial, "dropped", f"dropped: {why}", choice.default))
    with Database(setup.db) as db:
        db.judge(setup.key, setup.shares, verdicts, setup.session)


def _latency(
    setup: Setup, decision: Decision | None, final: Callable[[], object]
) -> dict[str, float]:
    """Default and tuned medians from the A/B of the set kept (else of the last set
    tried; the default's alone without candidates); onnxruntime beside the model as run."""
    attempt: Attempt | None = None
    if decision is not None:
        measured_ones = [a for a in decision.attempts if a.estimate.rounds]
        attempt = next((a for a in measured_ones if a.tasks == decision.kept), None)
        attempt = attempt or (measured_ones[-1] if measured_ones else None)
    contenders = {"polyonnx": final}
    ort = _onnxruntime(setup) if setup.compare_ort else None
    if ort is not None:
        contenders["onnxruntime"] = ort
    measured = latencies(contenders, setup.eval_s) if attempt is None or ort else {}
    latency = {}
    if attempt is not None:
        latency["default"] = attempt.estimate.default_s
        kept = decision is not None and bool(decision.kept)
        latency["tuned"] = attempt.estimate.tuned_s if kept else attempt.estimate.default_s
    else:
        latency["default"] = latency["tuned"] = measured["polyonnx"]
    if "onnxruntime" in measured:
        latency["onnxruntime"] = measured["onnxruntime"]
        latency["as run, beside onnxruntime"] = measured["polyonnx"]
    return latency


def latencies(contenders: Mapping[str, Callable[[], object]], seconds: float) -> dict[str, float]:
    """Median seconds per run of each contender, timed in turn in blocks (module
    constants), so that a busy moment of the machine hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for run in contenders.values():
        run()  # warm-up
    rounds = 0
    while rounds < MAX_ROUNDS_LATENCY and (
        rounds < MIN_ROUNDS_LATENCY or min(sum(t) for t in times.values()) < seconds
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
    return {name: float(np.median(t)) for name, t in times.items()}


def _onnxruntime(setup: Setup) -> Callable[[], object] | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = setup.key.threads
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(setup.model, options, providers=["CPUExecutionProvider"])
    except Exception:  # a model onnxruntime cannot load: report without it
        return None
    feed = random_inputs(setup.program)
    names = {i.name for i in session.get_inputs()}
    ort_feed = {k: v for k, v in feed.items() if k in names}
    return lambda: session.run(None, ort_feed)
