"""A tuning session: profile the model, then spend the budget on its tasks, largest
share of the model's time first, every trial committed to the database as it finishes.

    result = tune("model.onnx", Options(budget_s=600, threads=2), on_trial=print)

1. The default schedules are compiled with per-kernel timers and run: each task's share
   of the model's time (tasks under ``min_share`` are not tuned).
2. Each task's earlier trials under this machine's key are read back from the database:
   nothing measured before is measured again (``resume``, the default).
3. Rounds of trials go to the task with the largest ``share / (trials + 1)``: trials in
   proportion to the share of time, the biggest kernels first. A task's first trial is
   its default schedule (measured once, ever); its candidates are timed against it.
4. Each task's best trace, if measured only once, is measured again (a lucky run among
   hundreds is not a speed-up; `Database.best` judges a trace by its slowest measurement).
5. The model-level A/B (tune/evaluate.py, tune/verdict.py): the default model and the
   model tuned with every record that beat its default at kernel level are timed in
   alternating rounds; the records stay in use only if the model is faster beyond the
   measured noise (else the subsets of most expected gain are tried, while the time
   allows). Every record weighed is marked kept or dropped in the database; `run` uses
   the kept ones only. The A/B's time is within the budget.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Program
from polyonnx.runtime.blocks import one_sample_shapes
from polyonnx.runtime.compiled import compile_program, default_schedules, lower_model
from polyonnx.tune.db import Database, Key, Trial, default_path
from polyonnx.tune.evaluate import SECONDS, Outcome, Setup, evaluate
from polyonnx.tune.measure import Job, Workers
from polyonnx.tune.runner import Measurement, kernel_schedule, random_inputs
from polyonnx.tune.search import TaskSearch
from polyonnx.tune.space import Space, space_for
from polyonnx.tune.tasks import Task, model_tasks, rename_trace


@dataclass(frozen=True)
class Options:
    budget_s: float = 600.0
    """Wall seconds for the whole session, the model-level A/B and the final latency
    measurement included."""
    trials: int | None = None
    """Stop after this many trials in this session, defaults included (None: no limit)."""
    threads: int = 0
    """Threads the model will run on (0: all cores); trials are timed on as many."""
    jobs: int = 1
    """Candidates built and timed at once (more than one makes times noisier)."""
    db: str | None = None
    shapes: Mapping[str, Sequence[int]] | None = None
    resume: bool = True
    """Read earlier trials back (False: search as if the database were empty, still
    writing to it)."""
    min_share: float = 0.005
    batch: int = 4
    timeout_s: float = 60.0
    seed: int = 0
    compare_ort: bool = True
    eval_s: float = SECONDS
    """Seconds of runs per contender when onnxruntime is timed beside the tuned model."""
    verdict_s: float | None = None
    """Seconds set aside in the budget for the model-level A/B, compiles included (None:
    `verdict_seconds`). Its first A/B runs its minimum rounds even past them."""
    fault: str = ""
    """Fault injection for tests (tune/worker.py: ``segv:3,hang:5``)."""


@dataclass
class TaskProgress:
    """One task during a session: its search and tallies."""

    task: Task
    share: float
    space: Space | None = None
    search: TaskSearch | None = None
    default_s: float | None = None
    best_s: float | None = None
    """The best trial's time on the default's scale: ``default_s`` times its ratio to the
    default schedule measured alongside it."""
    best_trace: list[dict] = field(default_factory=list)
    earlier: int = 0
    """Trials of this task read back from earlier sessions."""
    trials: int = 0
    """Trials of this task measured in this session."""
    failures: int = 0
    """... and how many of them failed."""
    spent_s: float = 0.0
    """Wall seconds this session's trials of the task took (building and timing)."""
    note: str = ""
    tuned_s: float | None = None
    """The task's record the model-level A/B weighed: the default's time times the
    record's ratio (None: no record beat the default by the margin)."""
    in_use: bool = False
    """The A/B kept that record: ``polyonnx run`` uses it."""
    dropped: str = ""
    """Why the A/B dropped it."""
    default_tried: bool = False
    """Its default schedule was sent to be measured this session. A task's default is
    measured when the search first picks it, not every task's before any search: at ~2 s
    a measurement, a one-minute session on light SqueezeNet (25 tasks) spent its budget
    on four defaults and tried no candidate."""

    def ready(self) -> bool:
        """Whether a trial can go to it now: its default is measured, or not yet sent."""
        return self.default_s is not None or not self.default_tried

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
    """Model latency, median seconds: "default", "tuned" (from the A/B), "onnxruntime"
    and "as run, beside onnxruntime"."""
    applied: int = 0
    skipped: list[str] = field(default_factory=list)
    stopped: str = ""
    outcome: Outcome | None = None
    """The model-level A/B: its decision, the candidates weighed, its wall seconds."""
    budget_s: float = 0.0


TrialCallback = Callable[[TaskProgress, Trial, Result], None]

CONFIRM_SECONDS = 1.0
CONFIRM_TASKS = 3
"""Time set aside for measuring a task's best trace a second time, for at most
CONFIRM_TASKS tasks: confirmation goes largest task first and stops at its own deadline.
Set aside for every task, it left a one-minute session on light SqueezeNet (25 tasks)
no time to search at all."""

VERDICT_SHARE = 0.2
VERDICT_MIN_S = 5.0
VERDICT_MAX_S = 120.0
"""The model-level A/B's share of the budget, and its bounds in seconds."""


def verdict_seconds(options: Options) -> float:
    """Seconds of the budget set aside for the model-level A/B."""
    if options.verdict_s is not None:
        return max(options.verdict_s, 0.0)
    return min(max(VERDICT_SHARE * options.budget_s, VERDICT_MIN_S), VERDICT_MAX_S)


def tune(model: str, options: Options, on_trial: TrialCallback | None = None) -> Result:
    """Tune ``model``'s kernels (module docstring); every trial goes to the database as it
    finishes, so an interrupted session loses nothing."""
    start = time.monotonic()
    threads = options.threads or os.cpu_count() or 1
    one_sample = one_sample_shapes(model, options.shapes)
    if one_sample is not None:  # a batch runs one sample's code (runtime/blocks.py): tune it
        options = dataclasses.replace(options, shapes=one_sample)
    program = lower_model(model, options.shapes)
    db_path = options.db or str(default_path(model))
    key = Key.host(threads)
    result = Result(model, db_path, key, [], budget_s=options.budget_s)
    shares = _shares(program, threads)
    result.tasks = [
        TaskProgress(task, sum(shares.get(k, 0.0) for k in task.kernels))
        for task in model_tasks(program)
    ]
    result.tasks.sort(key=lambda t: -t.share)
    compile_s = time.monotonic() - start
    with Database(db_path) as db, Workers(options.jobs, options.timeout_s, _env(options)) as pool:
        for progress in result.tasks:
            _prepare(progress, program, db, key, threads, options)
            result.resumed += progress.earlier
        tuned = [t for t in result.tasks if t.search is not None]
        confirm_s = CONFIRM_SECONDS * min(len(tuned), CONFIRM_TASKS)
        ort_s = 2 * options.eval_s if options.compare_ort else 0.0
        final_s = 2 * compile_s + verdict_seconds(options) + ort_s  # the A/B, onnxruntime
        runner = _Runner(model, program, db, key, options, threads, result, on_trial)
        end = start + options.budget_s
        search_end = start + max(options.budget_s - final_s - confirm_s - 2, 0.0)
        result.stopped = runner.search(pool, search_end)
        runner.confirm(pool, end - final_s)
    ab_end = min(time.monotonic() + final_s - ort_s, end - ort_s)
    _evaluate(result, program, options, runner.session, ab_end)
    result.elapsed_s = time.monotonic() - start
    return result


def _shares(program: Program, threads: int) -> dict[str, float]:
    """Each kernel's share of the default model's time (a profiling build, 5 runs)."""
    compiled = compile_program(program, default_schedules(program), profile=True, checks=False)
    compiled.set_threads(threads)
    feed = random_inputs(program)
    compiled.run(feed)
    compiled.reset_profile()
    for _ in range(5):
        compiled.run(feed)
    return {p.kernel: p.share for p in compiled.kernel_profile()}


def _env(options: Options) -> dict[str, str]:
    return {"POLYONNX_TUNE_FAULT": options.fault} if options.fault else {}


def _prepare(
    progress: TaskProgress, program: Program, db: Database, key: Key, threads: int,
    options: Options,
) -> None:  # fmt: skip
    """The task's search space, and (resuming) its earlier trials fed to its search.
    Earlier trials count as resumed even where the task is not searched this time: its
    share of the model's time is measured, and a task near ``min_share`` may fall below
    it in one session and not the next."""
    earlier = list(db.trials(progress.task.hash, key)) if options.resume else []
    progress.earlier = len(earlier)
    if progress.share < options.min_share:
        progress.note = f"{progress.share:.1%} of the model's time"
        return
    kernel = program.kernel(progress.task.name)
    try:
        progress.space = space_for(kernel, program.buffers, threads, _lanes(), program)
    except ScheduleError as exc:
        progress.note = f"no search space: {exc}"
        return
    progress.search = TaskSearch(progress.space, options.seed)
    if not options.resume:
        return
    default = db.default(progress.task.hash, key)
    progress.default_s = default.median_s if default else None
    for trial in earlier:
        trace = rename_trace(trial.trace, progress.task.name)  # tuned on a twin kernel?
        if trial.is_default:
            progress.search.record([], trial.median_s, default=True)
            continue
        seconds = None  # on the default's scale, as in _Runner._commit
        if trial.status == "ok" and trial.baseline_s:
            scale = progress.default_s or trial.baseline_s
            seconds = scale * trial.median_s / trial.baseline_s
        elif trial.status == "ok" and default is not None:
            seconds = trial.median_s
        progress.search.record(trace, seconds)
        progress.consider(trace, seconds)
    progress.consider([], progress.default_s)


def _lanes() -> int:
    from polyonnx.target import host_target

    return host_target().lanes(4)


def _evaluate(
    result: Result, program: Program, options: Options, session: str, deadline: float
) -> None:
    """The model-level A/B, its verdicts written, and each task's record and state."""
    shares: dict[str, float] = {}
    for progress in result.tasks:
        shares[progress.task.hash] = shares.get(progress.task.hash, 0.0) + progress.share
    setup = Setup(result.model, program, result.db, result.key, shares, session,
                  options.compare_ort, options.eval_s)  # fmt: skip
    outcome = evaluate(setup, deadline)
    result.outcome, result.latency = outcome, outcome.latency
    result.skipped, result.applied = outcome.skipped, len(outcome.used)
    decision = outcome.decision
    for progress in result.tasks:
        choice = outcome.candidates.get(progress.task.hash)
        if choice is None or not progress.default_s:
            continue
        progress.tuned_s = progress.default_s * choice.trial.ratio(choice.default)
        progress.in_use = decision is not None and progress.task.hash in decision.kept
        if not progress.in_use and decision is not None:
            progress.dropped = decision.reasons.get(progress.task.hash, "")


def _priority(task: TaskProgress, pending: Mapping[str, int]) -> float:
    """Trials go where this is largest: trials in proportion to the share of time."""
    return task.share / (task.earlier + task.trials + pending.get(task.task.hash, 0) + 1)


class _Runner:
    """Sends jobs to the workers, commits every result, keeps the tallies."""

    def __init__(
        self, model: str, program: Program, db: Database, key: Key, options: Options,
        threads: int, result: Result, on_trial: TrialCallback | None,
    ):  # fmt: skip
        self.model, self.program, self.db, self.key = model, program, db, key
        self.options, self.threads, self.result, self.on_trial = options, threads, result, on_trial
        self.session = uuid.uuid4().hex[:12]

    def search(self, pool: Workers, deadline: float) -> str:
        """Rounds of candidates until the budget, the trials or the candidates run out;
        returns which."""
        while True:
            if time.monotonic() >= deadline:
                return "budget"
            if self._left(1) == 0:
                return "trials"
            open_tasks = [
                t for t in self.result.tasks
                if t.search is not None and not t.search.exhausted() and t.ready()
            ]  # fmt: skip
            if not open_tasks:
                return "no new candidates" if self.result.trials else "nothing to tune"
            batch: list[tuple[TaskProgress, list[dict]]] = []
            pending: dict[str, int] = {}
            for _ in range(max(self.options.jobs, 1)):
                ready = [t for t in open_tasks if t.ready()]  # a default just sent is not
                room = self._left(self.options.batch + len(batch)) - len(batch)
                if room <= 0 or not ready:
                    break
                progress = max(ready, key=lambda t: _priority(t, pending))
                if progress.default_s is None:  # a task's default is measured first, once
                    progress.default_tried = True
                    pending[progress.task.hash] = 1
                    batch.append((progress, []))
                    continue
                proposals = progress.search.propose(room)
                if not proposals:
                    progress.search.done = True  # no new candidate in its space
                    continue
                pending[progress.task.hash] = pending.get(progress.task.hash, 0) + len(proposals)
                batch += [(progress, progress.space.trace(g)) for g in proposals]
            if batch:
                self._run(pool, batch, deadline)

    def confirm(self, pool: Workers, deadline: float) -> None:
        """Measure each task's best trace again where it was measured once only."""
        work = []
        for progress in self.result.tasks:
            if progress.search is None or not progress.best_trace:
                continue
            best = self.db.best(progress.task.hash, self.key, candidates=True)
            if best is None or self.db.count(progress.task.hash, self.key, best.trace) > 1:
                continue
            work.append((progress, rename_trace(best.trace, progress.task.name)))
        self._run(pool, work[: self._left(len(work))], deadline)

    def _left(self, wanted: int) -> int:
        """How many of ``wanted`` more trials the trial limit allows."""
        if self.options.trials is None:
            return wanted
        return max(min(wanted, self.options.trials - self.result.trials), 0)

    def _run(self, pool: Workers, work: list[tuple[TaskProgress, list[dict]]], deadline) -> None:
        jobs = []
        for progress, trace in work:
            illegal = self._illegal(progress, trace)
            if illegal is not None:
                self._commit(progress, trace, Measurement("failed", illegal))
                continue
            jobs.append(
                Job(self.model, progress.task.name, trace, self.threads, self.options.shapes,
                    tag=(progress, trace))
            )  # fmt: skip
        for job, measurement in pool.run(jobs, deadline):
            progress, trace = job.tag
            self._commit(progress, trace, measurement)

    def _commit(self, progress: TaskProgress, trace: list[dict], measurement: Measurement) -> None:
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
            verdict="pending",  # used by `run` once the session's A/B keeps it
        )
        self.db.add(trial)
        ok = measurement.status == "ok"
        progress.trials += 1
        progress.failures += not ok
        progress.spent_s += measurement.wall_s
        self.result.trials += 1
        self.result.failures += not ok
        if not trace:
            progress.default_s = measurement.median_s if ok else None
            progress.search.record(trace, measurement.median_s, default=True)
            progress.consider([], progress.default_s)
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
