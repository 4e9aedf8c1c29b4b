"""Tuning sessions end to end on a small model: trials committed, resumed without
re-measuring, crashes recorded, and records applied only when they are this machine's
and faster than the default."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from polyonnx.cli import main
from polyonnx.inference import InferenceSession
from polyonnx.runtime.compiled import lower_model
from polyonnx.tune.db import Database, Key, Trial, canonical
from polyonnx.tune.session import Options, tune
from polyonnx.tune.tasks import model_tasks
from polyonnx.tune.verdict import MIN_ROUNDS

QUICK = {"budget_s": 120.0, "eval_s": 0.05, "compare_ort": False, "threads": 2, "verdict_s": 1.0}


def test_a_session_commits_every_trial_and_resumes(model_path, tmp_path):
    db_path = str(tmp_path / "t.db")
    seen = []
    first = tune(model_path, Options(trials=10, db=db_path, **QUICK), lambda *a: seen.append(a[1]))
    assert first.trials == 10 == len(seen)
    with Database(db_path) as db:
        assert len(db) == 10
    tuned = [t for t in first.tasks if t.search is not None]
    assert {t.task.op_type for t in tuned} >= {"MatMul"}
    firsts: dict[str, list] = {}
    for trial in seen:
        firsts.setdefault(trial.task, trial.trace)
    assert all(trace == [] for trace in firsts.values())  # a task's default comes first
    assert all(t.default_s for t in tuned if t.trials > 1)
    assert first.latency["default"] > 0 and first.latency["tuned"] > 0

    second = tune(model_path, Options(trials=6, db=db_path, **QUICK))
    assert second.resumed == 10 and second.trials == 6
    with Database(db_path) as db:
        key = Key.host(2)
        for task in model_tasks(lower_model(model_path)):
            traces = collections.Counter(canonical(t.trace) for t in db.trials(task.hash, key))
            # once, or twice for a task's best (the confirmation); the default once
            assert max(traces.values(), default=0) <= 2, "a trace was measured again"
            assert traces["[]"] <= 1


def test_the_largest_task_gets_candidates_before_every_small_default(model_path, tmp_path):
    # with room for few trials, they go by share: the largest task's default and then its
    # candidates, not the default of every task first (a short session on a model with
    # many tasks used to measure defaults only)
    result = tune(model_path, Options(trials=3, db=str(tmp_path / "t.db"), **QUICK))
    tuned = [t for t in result.tasks if t.search is not None]
    assert len(tuned) >= 3, "the test needs more tasks than trials"
    largest = max(tuned, key=lambda t: t.share)
    assert largest.trials >= 2 and largest.default_s is not None
    assert any(t.trials == 0 for t in tuned)


def test_trials_of_a_task_no_longer_searched_still_count_as_resumed(model_path, tmp_path):
    # a task's share of the model's time is measured: one near min_share may be searched
    # in one session and skipped in the next; its trials are still in the database
    db_path = str(tmp_path / "t.db")
    tune(model_path, Options(trials=6, db=db_path, **QUICK))
    skipped = tune(model_path, Options(trials=2, db=db_path, min_share=1.1, **QUICK))
    assert all(t.search is None for t in skipped.tasks)
    assert skipped.resumed == 6 and skipped.trials == 0


def test_a_crashing_candidate_is_recorded_and_the_session_goes_on(model_path, tmp_path):
    db_path = str(tmp_path / "t.db")
    result = tune(model_path, Options(trials=8, db=db_path, fault="segv:5", **QUICK))
    assert result.trials == 8 and result.failures >= 1
    with Database(db_path) as db:
        key = Key.host(2)
        failed = [
            t for task in result.tasks for t in db.trials(task.task.hash, key) if t.status != "ok"
        ]
    assert any(t.reason.startswith("crashed: signal SIGSEGV") for t in failed)


def _records(
    db_path: str, model_path: str, key: Key, tuned_s: float, baseline_s: float | None = None
) -> str:
    """A default trial (1 ms) and a made-up tuned one for the MatMul task."""
    program = lower_model(model_path)
    task = next(t for t in model_tasks(program) if t.op_type == "MatMul")
    trace = [{"kernel": "mm1", "primitive": "ukernel", "args": {"params": {"mr": 4}}}]
    with Database(db_path) as db:
        for steps, seconds, base in (([], 1e-3, 1e-3), (trace, tuned_s, baseline_s)):
            db.add(
                Trial(task.hash, "MatMul", "mm1", steps, "ok", None, seconds, 0.0, 5, key,
                      baseline_s=base)
            )  # fmt: skip
    return task.hash


@pytest.mark.parametrize(
    ("tuned_s", "baseline_s", "applied"),
    [
        (0.5e-3, None, True),
        (0.99e-3, None, False),  # within the noise margin
        (2e-3, None, False),
        (1.2e-3, 2.4e-3, True),  # the machine was slower then: half the default's time
        (0.5e-3, 0.5e-3, False),  # ... or faster: no gain over the default alongside
    ],
)
def test_sessions_use_records_only_when_faster(
    model_path, tmp_path, tuned_kernels, tuned_s, baseline_s, applied
):
    db_path = str(tmp_path / "t.db")
    _records(db_path, model_path, Key.host(2), tuned_s, baseline_s)
    session = InferenceSession(model_path, threads=2, tuning_db=db_path)
    assert set(tuned_kernels(session)) == ({"mm1", "mm2"} if applied else set())
    feed = {i.name: np.ones(i.shape, np.float32) for i in session.get_inputs()}
    plain = InferenceSession(model_path, threads=2, tuning_db=False)
    np.testing.assert_allclose(session.run(None, feed)[0], plain.run(None, feed)[0], rtol=1e-5)


def test_records_of_another_cpu_or_version_are_skipped_and_said(
    model_path, tmp_path, tuned_kernels
):
    db_path = str(tmp_path / "t.db")
    host = Key.host(2)
    _records(
        db_path, model_path, Key("skylake-avx512", host.features, host.polyonnx, host.llvm, 2), 1e-4
    )
    session = InferenceSession(model_path, threads=2, tuning_db=db_path)
    assert tuned_kernels(session) == ()
    assert any("skylake-avx512" in reason for reason in session.records.skipped)
    other = tmp_path / "v.db"
    _records(str(other), model_path, Key(host.cpu, host.features, "0.0.1", host.llvm, 2), 1e-4)
    session = InferenceSession(model_path, threads=2, tuning_db=str(other))
    assert tuned_kernels(session) == ()
    assert any("polyonnx 0.0.1" in reason for reason in session.records.skipped)


def test_two_jobs_at_once_never_measure_one_trace_twice(model_path, tmp_path):
    db_path = str(tmp_path / "t.db")
    result = tune(model_path, Options(trials=12, jobs=2, db=db_path, **QUICK))
    assert result.trials == 12
    with Database(db_path) as db:
        for task in result.tasks:
            traces = collections.Counter(
                canonical(t.trace) for t in db.trials(task.task.hash, result.key)
            )
            assert max(traces.values(), default=0) <= 2


def test_the_budget_bounds_the_session(model_path, tmp_path):
    result = tune(model_path, Options(db=str(tmp_path / "t.db"), **{**QUICK, "budget_s": 8.0}))
    assert result.stopped == "budget"
    assert result.elapsed_s < 8.0 + 4.0  # the job running at the deadline may finish


LAST_LINE = re.compile(
    r"tuned model: (\d+\.\d\d)× the default "
    r"\((95% CI (\d+\.\d+)–(\d+\.\d+), (\d+) rounds|the default is kept: no tuned records in use)\)"
)


def test_a_session_ends_with_a_model_level_ab_and_an_honest_last_line(
    model_path, tmp_path, capsys, tuned_kernels
):
    # a record that claims twice the default's speed at kernel level: the A/B weighs it
    db_path = str(tmp_path / "t.db")
    task = _records(db_path, model_path, Key.host(2), 0.5e-3, 1e-3)
    command = ["tune", model_path, "--db", db_path, "--trials", "3", "--budget", "40s",
               "--no-ort", "--threads", "2"]  # fmt: skip
    assert main(command) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    match = LAST_LINE.fullmatch(last)
    assert match, last
    assert float(match.group(1)) >= 1.0
    assert "model-level A/B (the default model and the tuned one" in out
    rounds = [int(n) for n in re.findall(r"CI [\d.]+–[\d.]+, (\d+) rounds", out)]
    assert rounds and min(rounds) >= MIN_ROUNDS
    with Database(db_path) as db:
        weighed = [t for t in db.trials(task, Key.host(2)) if t.trace and t.verdict != "pending"]
        assert weighed, "the claimed record was not judged"
        kept = db.best(task, Key.host(2))
    session = InferenceSession(model_path, threads=2, tuning_db=db_path)
    if match.group(3) is None:  # the default kept: run uses no record, the table says so
        assert tuned_kernels(session) == () and kept is None
        assert "record dropped (not used by run)" in out
        assert not re.search(r"\bin use\b", out.split("speed-up: the kernel")[0])
    else:
        assert float(match.group(3)) > 1.0 and kept is not None
        assert set(tuned_kernels(session))
        assert re.search(r"\bin use\b", out)
