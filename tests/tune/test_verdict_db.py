"""The A/B's verdicts in the tuning database: a session's trials are not used until its
A/B keeps them, dropped records are never returned by the loader ``polyonnx run`` uses
(nor by a resumed session's choice of candidates), records from elsewhere that the A/B
dropped stay unused, and a version 1 database migrates."""

from __future__ import annotations

import io
import sqlite3

import pytest

from polyonnx.errors import TuningError
from polyonnx.inference import InferenceSession
from polyonnx.runtime.compiled import lower_model
from polyonnx.tune.apply import Records
from polyonnx.tune.db import SCHEMA_VERSION, Database, Key, Trial, Verdict, canonical
from polyonnx.tune.session import Options, tune
from polyonnx.tune.tasks import model_tasks

ZEN = Key("znver4", "+avx2,+avx512f,+fma", "0.1.0", "22.1.0", 1)
FAST = [{"kernel": "k", "primitive": "ukernel", "args": {"params": {"mr": 4}}}]
FASTER = [{"kernel": "k", "primitive": "ukernel", "args": {"params": {"mr": 8}}}]


def trial(trace=(), median=1e-3, verdict=None, key=ZEN, task="t1") -> Trial:
    return Trial(task, "MatMul", "k", list(trace), "ok", None, median, 0.0, 5, key,
                 baseline_s=1e-3, verdict=verdict, session="s")  # fmt: skip


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "t.db") as opened:
        yield opened


def test_pending_trials_are_candidates_but_not_used_until_kept(db):
    db.add(trial())
    fast = trial(FAST, 0.5e-3, "pending")
    db.add(fast)
    assert db.best("t1", ZEN) is None  # what run uses: nothing judged kept yet
    assert db.best("t1", ZEN, candidates=True) == fast
    db.judge(ZEN, ["t1"], [Verdict(fast, "kept", "kept: 1.10×")], "s2")
    assert db.best("t1", ZEN).trace == FAST
    assert db.trials("t1", ZEN)[1].verdict_reason == "kept: 1.10× (session s2)"


def test_a_dropped_record_is_never_chosen_again(db):
    db.add(trial())
    faster, fast = trial(FASTER, 0.4e-3, "pending"), trial(FAST, 0.5e-3, "pending")
    db.add(faster)
    db.add(fast)
    db.judge(ZEN, ["t1"], [Verdict(faster, "dropped", "dropped: 0.99×")])
    assert db.best("t1", ZEN) is None
    assert db.best("t1", ZEN, candidates=True) == fast  # the next one gets its A/B
    db.add(trial(FASTER, 0.3e-3, "pending"))  # measured again later (--no-resume)
    assert db.best("t1", ZEN, candidates=True) == fast
    assert db.dropped("t1", ZEN) == {canonical(FASTER)}


def test_judging_again_keeps_exactly_the_new_set(db):
    db.add(trial())
    old, new = trial(FAST, 0.5e-3, "pending"), trial(FASTER, 0.4e-3, "pending")
    db.add(old)
    db.judge(ZEN, ["t1"], [Verdict(old, "kept", "kept")])
    db.add(new)
    assert db.best("t1", ZEN) == db.trials("t1", ZEN)[1]  # the old kept one, until judged
    db.judge(ZEN, ["t1"], [Verdict(new, "dropped", "dropped")])
    # the A/B measured the model without either: the old record is pending, not used
    assert db.best("t1", ZEN) is None
    assert [t.verdict for t in db.trials("t1", ZEN)] == [None, "pending", "dropped"]


def test_never_judged_records_keep_the_old_rule_until_a_session_judges_their_task(db):
    db.add(trial())
    legacy, other = trial(FAST, 0.5e-3), trial(FASTER, 0.6e-3)
    db.add(legacy)
    db.add(other)
    assert db.best("t1", ZEN) == legacy and not db.judged("t1", ZEN)
    db.judge(ZEN, ["t1"], [Verdict(legacy, "dropped", "dropped")])
    assert db.judged("t1", ZEN)
    assert db.best("t1", ZEN) is None  # `other` was never weighed: pending, not used
    assert db.best("t1", ZEN, candidates=True).trace == FASTER


def test_a_verdict_on_a_record_from_elsewhere_is_kept_here(tmp_path):
    # the shipped records are read-only: a verdict on one is written into the user's
    # database, with a copy of the record (and of its default where there is none)
    shipped = Database(":memory:")
    default, record = trial(key=ZEN), trial(FAST, 0.5e-3, key=ZEN)
    shipped.add(default)
    shipped.add(record)
    with Database(tmp_path / "user.db") as user:
        records = Records(ZEN, [user, shipped], candidates=True)
        assert records.best(["t1"]) == {"t1": record}
        user.judge(ZEN, ["t1"], [Verdict(record, "dropped", "dropped", default)])
        assert Records(ZEN, [user, shipped]).best(["t1"]) == {}  # as run uses them
        assert Records(ZEN, [user, shipped], candidates=True).best(["t1"]) == {}
        user.judge(ZEN, ["t1"], [Verdict(record, "kept", "kept", default)])
        assert Records(ZEN, [user, shipped]).best(["t1"])["t1"].uid == record.uid
        assert user.default("t1", ZEN).uid == default.uid


def test_verdicts_travel_with_export_and_import(db, tmp_path):
    db.add(trial())
    db.add(trial(FAST, 0.5e-3, "pending"))
    db.judge(ZEN, ["t1"], [Verdict(db.trials("t1", ZEN)[1], "dropped", "dropped: 0.98×")])
    out = io.StringIO()
    db.export_jsonl(out)
    with Database(tmp_path / "copy.db") as copy:
        copy.import_jsonl(io.StringIO(out.getvalue()))
        assert copy.trials("t1", ZEN) == db.trials("t1", ZEN)
        assert copy.best("t1", ZEN, candidates=True) is None
    with pytest.raises(TuningError, match="verdict must be"):
        trial(verdict="maybe")
    with pytest.raises(TuningError, match="'kept' or 'dropped'"):
        db.judge(ZEN, ["t1"], [Verdict(trial(FAST), "pending", "")])


V1_TRIALS = """CREATE TABLE trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT, uid TEXT NOT NULL UNIQUE, task TEXT NOT NULL,
    op_type TEXT NOT NULL, kernel TEXT NOT NULL, trace TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')), reason TEXT, median_s REAL,
    spread_s REAL, repeats INTEGER NOT NULL, baseline_s REAL, cpu TEXT NOT NULL,
    features TEXT NOT NULL, polyonnx TEXT NOT NULL, llvm TEXT NOT NULL,
    threads INTEGER NOT NULL, model TEXT NOT NULL, session TEXT NOT NULL,
    created REAL NOT NULL)"""


def _v1_database(path, rows) -> None:
    """A tuning database as polyonnx wrote it before verdicts (schema version 1)."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.execute(V1_TRIALS)
    for n, (trace, median) in enumerate(rows):
        conn.execute(
            "INSERT INTO trials (uid, task, op_type, kernel, trace, status, median_s, "
            "repeats, baseline_s, cpu, features, polyonnx, llvm, threads, model, session, "
            "created) VALUES (?, 't1', 'MatMul', 'k', ?, 'ok', ?, 5, 1e-3, ?, ?, ?, ?, ?, "
            "'m.onnx', 's', 0)",
            (f"u{n}", trace, median, ZEN.cpu, ZEN.features, ZEN.polyonnx, ZEN.llvm, ZEN.threads),
        )
    conn.commit()
    conn.close()


def test_a_version_1_database_migrates_and_its_records_still_apply(tmp_path):
    path = tmp_path / "old.db"
    _v1_database(path, [("[]", 1e-3), (canonical(FAST), 0.5e-3)])
    with Database(path, create=False) as db:
        assert [t.verdict for t in db.trials("t1", ZEN)] == [None, None]
        assert db.best("t1", ZEN).trace == FAST  # never judged: the old rule
        db.add(trial(FASTER, 0.4e-3, "pending"))
        db.judge(ZEN, ["t1"], [Verdict(db.trials("t1", ZEN)[2], "kept", "kept")])
        assert db.best("t1", ZEN).trace == FASTER
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    columns = [row[1] for row in conn.execute("PRAGMA table_info(trials)")]
    conn.close()
    assert version == (str(SCHEMA_VERSION),) and columns[-2:] == ["verdict", "verdict_reason"]
    with Database(path) as again:  # opened again: nothing to migrate, nothing lost
        assert len(again) == 3 and again.best("t1", ZEN).trace == FASTER


def _matmul_records(db_path: str, model_path: str, key: Key, verdict: str | None) -> Trial:
    program = lower_model(model_path)
    task = next(t for t in model_tasks(program) if t.op_type == "MatMul")
    trace = [{"kernel": "mm1", "primitive": "ukernel", "args": {"params": {"mr": 4}}}]
    record = Trial(task.hash, "MatMul", "mm1", trace, "ok", None, 0.5e-3, 0.0, 5, key,
                   baseline_s=1e-3, verdict=verdict)  # fmt: skip
    with Database(db_path) as db:
        db.add(Trial(task.hash, "MatMul", "mm1", [], "ok", None, 1e-3, 0.0, 5, key))
        db.add(record)
    return record


def test_run_skips_dropped_records_and_a_resumed_session_keeps_them_dropped(
    model_path, tmp_path, tuned_kernels
):
    db_path = str(tmp_path / "t.db")
    key = Key.host(2)
    record = _matmul_records(db_path, model_path, key, "pending")
    session = InferenceSession(model_path, threads=2, tuning_db=db_path)
    assert tuned_kernels(session) == ()  # pending: not used by run
    with Database(db_path) as db:
        db.judge(key, [record.task], [Verdict(record, "kept", "kept")])
    session = InferenceSession(model_path, threads=2, tuning_db=db_path)
    assert set(tuned_kernels(session)) == {"mm1", "mm2"}
    with Database(db_path) as db:
        db.judge(key, [record.task], [Verdict(record, "dropped", "dropped: 0.97×")])
    session = InferenceSession(model_path, threads=2, tuning_db=db_path)
    assert tuned_kernels(session) == ()

    options = Options(trials=3, db=db_path, budget_s=120.0, eval_s=0.05, compare_ort=False,
                      threads=2, verdict_s=1.0)  # fmt: skip
    resumed = tune(model_path, options)
    assert resumed.resumed == 2
    assert record.task not in resumed.outcome.candidates or (
        resumed.outcome.candidates[record.task].trial.trace != record.trace
    )
    with Database(db_path) as db:
        same = [t for t in db.trials(record.task, key) if t.trace == record.trace]
        assert [t.verdict for t in same] == ["dropped"]
        in_use = db.best(record.task, key)
    assert in_use is None or in_use.trace != record.trace
    session = InferenceSession(model_path, threads=2, tuning_db=db_path)
    used = tuned_kernels(session)
    assert used == () or in_use is not None
