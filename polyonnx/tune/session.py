"""A tuning session: profile the model, then spend the budget on its tasks, largest
share of the model's time first, every trial committed to the database as it finishes.

    result = tune("model.onnx", Options(budget_s=600, threads=2), on_trial=print)

1. The default schedules are compiled with per-kernel timers and run: each task's share
   of the model's time (tasks under ``min_share`` are not tuned).
2. Each task's earlier trials under this machine's key are read back from the database:
   nothing measured before is measured again (``--resume``).
3. Every task's default schedule is measured (once, ever), then rounds of candidates go
   to the task with the largest ``share / (trials + 1)``: trials in proportion to the
   share of time, the biggest kernels first.
4. At the end the model is compiled with the records that beat the default by more than
   the noise margin, and default, tuned (and onnxruntime's) latencies are measured in the
   same run, interleaved.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from polyonnx.errors import ScheduleError
from polyonnx.runtime.compiled import compile_program, default_schedules, lower_model
from polyonnx.tune.apply import Records
from polyonnx.tune.db import Database, Key, Trial, default_path
from polyonnx.tune.evaluate import SECONDS, model_latency
from polyonnx.tune.measure import Job, Workers
from polyonnx.tune.runner import Measurement, kernel_schedule
from polyonnx.tune.search import TaskSearch
from polyonnx.tune.space import Space, space_for
from polyonnx.tune.tasks import Task, model_tasks, rename_trace


@dataclass(frozen=True)
class Options:
    budget_s: float = 600.0
    trials: int | None = None
    """Stop after this many trials in this session (None: only the budget)."""
    threads: int = 0
    """Threads the model will run on (0: all cores); trials are timed on as many."""
    jobs: int = 1
    """Candidates built and timed at once (more than one makes times noisier)."""
    db: str | None = None
    shapes: Mapping[str, Sequence[int]] | None = None
    min_share: float = 0.005
    batch: int = 4
    timeout_s: float = 60.0
    seed: int = 0
    compare_ort: bool = True
    eval_s: float = SECONDS
    """Seconds of runs per contender when the final model latencies are measured."""
    fault: str = ""
    """Fault injection for tests (tune/worker.py: ``segv:3,hang:5``)."""


@dataclass
class TaskProgress:
    task: Task
    share: float
    space: Space | None = None
    search: TaskSearch | None = None
    default_s: float | None = None
    best_s: float | None = None
    """The best trial's time on the default's scale: ``default_s`` times its ratio to the
    default schedule measured alongside it."""
    best_trace: list[dict] = field(default_factory=list)
    trials: int = 0
    """Trials of this task in the database (this session and before)."""
    session_trials: int = 0
    failures: int = 0
    spent_s: float = 0.0
    """Wall seconds this session's trials of the task took (building and timing)."""
    note: str = ""
    applied: bool = False
    """The tuned model runs the best record (it beat the default by the margin)."""

    def consider(self, trace: list[dict], seconds: float | None) -> None:
        """Keep ``trace`` as the best if it is faster (on the default's scale)."""
        if seconds is not None and (self.best_s is None or seconds < self.best_s):
            self.best_s, self.best_trace = seconds, trace

    @property
    def speedup(self) -> float | None:
        if self.default_s and self.best_s:
            return self.default_s / self.best_s
        return None


@dataclass
class Result:
    model: str
    db: str
    key: Key
    tasks: list[TaskProgress]
    trials: int = 0
    failures: int = 0
    resumed: int = 0
    """Trials read back from the database instead of measured again."""
    elapsed_s: float = 0.0
    latency: dict[str, float] = field(default_factory=dict)
    """Model latency, median seconds: "default", "tuned" and "onnxruntime"."""
    applied: int = 0
    skipped: list[str] = field(default_factory=list)
    stopped: str = ""


TrialCallback = Callable[[TaskProgress, Trial, Result], None]


def tune(model: str, options: Options, on_trial: TrialCallback | None = None) -> Result:
    start = time.monotonic()
    threads = options.threads or os.cpu_count() or 1
    program = lower_model(model, options.shapes)
    db_path = options.db or str(default_path(model))
    key = Key.host(threads)
    result = Result(model, db_path, key, [])
    compiling = time.monotonic()
    shares = _shares(program, threads)
    reserve = 2 * (time.monotonic() - compiling) + 3 * options.eval_s + 2  # for the final latency
    result.tasks = [
        TaskProgress(task, sum(shares.get(k, 0.0) for k in task.kernels))
        for task in model_tasks(program)
    ]
    result.tasks.sort(key=lambda t: -t.share)
    session = uuid.uuid4().hex[:12]
    with Database(db_path) as db, Workers(options.jobs, options.timeout_s, _env(options)) as pool:
        for progress in result.tasks:
            _prepare(progress, program, db, key, threads, options, result)
        runner = _Runner(model, program, db, key, session, options, threads, result, on_trial)
        deadline = start + max(options.budget_s - reserve, 0.0)
        runner.defaults(pool, deadline)
        result.stopped = runner.search(pool, deadline)
    records = Records.load(threads, db_path)
    try:
        result.latency, used = model_latency(
            model, program, records, threads, options.compare_ort, options.eval_s
        )
    finally:
        records.close()
    result.skipped = records.skipped
    result.applied = len(used)
    applied = {trial.task for trial in used.values()}
    for progress in result.tasks:
        progress.applied = progress.task.hash in applied
    result.elapsed_s = time.monotonic() - start
    return result


def _shares(program, threads: int) -> dict[str, float]:
    """Each kernel's share of the default model's time (a profiling build, 5 runs)."""
    compiled = compile_program(program, default_schedules(program), profile=True)
    compiled.set_threads(threads)
    feed = _feed(program)
    compiled.run(feed)
    compiled.reset_profile()
    for _ in range(5):
        compiled.run(feed)
    return {p.kernel: p.share for p in compiled.kernel_profile()}


def _feed(program) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    return {
        n: rng.standard_normal(program.buffers[n].shape).astype(program.buffers[n].dtype)
        for n in program.inputs
    }


def _env(options: Options) -> dict[str, str]:
    return {"POLYONNX_TUNE_FAULT": options.fault} if options.fault else {}


def _prepare(progress, program, db, key, threads, options, result) -> None:
    if progress.share < options.min_share:
        progress.note = f"not tuned: {progress.share:.1%} of the model's time"
        return
    kernel = program.kernel(progress.task.name)
    try:
        progress.space = space_for(kernel, program.buffers, threads, _lanes())
    except ScheduleError as exc:
        progress.note = f"not tuned: {exc}"
        return
    progress.search = TaskSearch(progress.space, options.seed)
    default = db.default(progress.task.hash, key)
    progress.default_s = default.median_s if default else None
    tuned = []
    for trial in db.trials(progress.task.hash, key):
        progress.trials += 1
        result.resumed += 1
        progress.failures += trial.status != "ok"
        if trial.is_default:
            progress.search.record([], trial.median_s, default=True)
            continue
        tuned.append(trial)
    for trial in tuned:
        ok = trial.status == "ok" and progress.default_s is not None
        seconds = progress.default_s * trial.ratio(default) if ok else None
        progress.search.record(trial.trace, seconds)
        progress.consider(trial.trace, seconds)
    progress.consider([], progress.default_s)


def _lanes() -> int:
    from polyonnx.emit.target import host_target

    return host_target().lanes(4)


class _Runner:
    """Sends jobs to the workers, commits every result, keeps the tallies."""

    def __init__(self, model, program, db, key, session, options, threads, result, on_trial):
        self.model, self.program, self.db, self.key = model, program, db, key
        self.session = session
        self.options, self.threads, self.result, self.on_trial = options, threads, result, on_trial

    def defaults(self, pool: Workers, deadline: float) -> None:
        todo = [t for t in self.result.tasks if t.search is not None and t.default_s is None]
        self._run(pool, [(t, []) for t in todo], deadline)

    def search(self, pool: Workers, deadline: float) -> str:
        while True:
            if time.monotonic() >= deadline:
                return "budget"
            if self.options.trials is not None and self.result.trials >= self.options.trials:
                return "trials"
            open_tasks = [
                t for t in self.result.tasks
                if t.search is not None and t.default_s is not None and not t.search.exhausted()
            ]  # fmt: skip
            if not open_tasks:
                return "no new candidates in any task's space"
            batch = []
            for _ in range(max(self.options.jobs, 1)):
                progress = max(open_tasks, key=lambda t: t.share / (t.trials + len(batch) + 1))
                size = self.options.batch
                if self.options.trials is not None:
                    size = min(size, self.options.trials - self.result.trials - len(batch))
                proposals = progress.search.propose(max(size, 0))
                if not proposals and size > 0:
                    progress.search.done = True  # no new candidate in its space
                batch += [(progress, progress.space.trace(g)) for g in proposals]
            if batch:
                self._run(pool, batch, deadline)

    def _run(self, pool: Workers, work: list[tuple[TaskProgress, list[dict]]], deadline) -> None:
        jobs = []
        for progress, trace in work:
            illegal = self._illegal(progress, trace)
            if illegal is not None:
                self._commit(progress, trace, Measurement("failed", illegal))
                continue
            jobs.append(
                Job(self.model, progress.task.name, rename_trace(trace, progress.task.name),
                    self.threads, self.options.shapes, tag=(progress, trace))
            )  # fmt: skip
        for job, measurement in pool.run(jobs):
            progress, trace = job.tag
            self._commit(progress, trace, measurement)

    def _commit(self, progress, trace, measurement: Measurement) -> None:
        trial = Trial(
            task=progress.task.hash,
            op_type=progress.task.op_type,
            kernel=progress.task.name,
            trace=trace,
            status=measurement.status,
            reason=measurement.reason,
            median_s=measurement.median_s,
            spread_s=measurement.spread_s,
            repeats=measurement.repeats,
            baseline_s=measurement.baseline_s,
            key=self.key,
            model=os.path.basename(self.model),
            session=self.session,
        )
        self.db.add(trial)
        ok = measurement.status == "ok"
        progress.trials += 1
        progress.session_trials += 1
        progress.failures += not ok
        progress.spent_s += measurement.wall_s
        self.result.trials += 1
        self.result.failures += not ok
        if not trace:
            progress.default_s = measurement.median_s
            progress.search.record(trace, measurement.median_s, default=True)
            progress.consider([], measurement.median_s)
        else:
            seconds = None
            if ok and progress.default_s and measurement.baseline_s:
                seconds = progress.default_s * measurement.median_s / measurement.baseline_s
            progress.search.record(trace, seconds)
            progress.consider(trace, seconds)
        if self.on_trial is not None:
            self.on_trial(progress, trial, self.result)

    def _illegal(self, progress: TaskProgress, trace: list[dict]) -> str | None:
        """Why the schedule API refuses ``trace`` (None: legal), found here in a fraction
        of the time a worker would take."""
        if not trace:
            return None
        try:
            kernel_schedule(self.program, progress.task.name, trace)
        except ScheduleError as exc:
            return f"illegal: {exc}"
        return None
