"""The tuning database: round trips, best-versus-default, schema checks, JSON lines, key
mismatches reported, and no committed trial lost to SIGKILL or SIGINT."""

from __future__ import annotations

import io
import json
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

import polyonnx
from polyonnx.errors import TuningError
from polyonnx.tune.db import (
    SCHEMA_VERSION,
    Database,
    Key,
    Trial,
    canonical,
    default_path,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZEN = Key("znver4", "+avx2,+avx512f,+fma", "0.1.0", "22.1.0", 1)
TILE = [{"op": "tile", "loop": "i", "sizes": [32, 64]}]
SPLIT = [{"op": "split", "loop": "j", "factor": 16}]


def trial(task="t1", trace=(), median=1e-3, key=ZEN, **kw) -> Trial:
    fields = dict(
        task=task,
        op_type="MatMul",
        kernel="MatMul_0",
        trace=list(trace),
        status="ok",
        reason=None,
        median_s=median,
        spread_s=None if median is None else median / 100,
        repeats=10,
        key=key,
        model="m.onnx",
        session="s1",
    )
    fields.update(kw)
    return Trial(**fields)


def failed(task="t1", trace=TILE, reason="crashed: signal SIGSEGV", key=ZEN) -> Trial:
    return trial(task, trace, None, key, status="failed", reason=reason, spread_s=None, repeats=0)


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "tune.db") as opened:
        yield opened


def test_trials_round_trip_in_order_with_failures(db, tmp_path):
    added = [
        trial(),
        failed(),
        trial(trace=SPLIT, median=5e-4),
        failed(reason="timeout after 20 s"),
    ]
    for t in added:
        db.add(t)
    assert db.trials("t1", ZEN) == added
    with Database(tmp_path / "tune.db") as again:  # another connection reads the same trials
        got = again.trials("t1", ZEN)
    assert got == added
    assert [t.reason for t in got] == [None, "crashed: signal SIGSEGV", None, "timeout after 20 s"]
    assert got[0].is_default and not got[2].is_default
    assert db.trials("t2", ZEN) == [] and len(db) == 4


def test_trace_is_normalised_to_json_and_must_be_json():
    t = trial(trace=[{"sizes": (4, 8)}])
    assert t.trace == [{"sizes": [4, 8]}]
    with pytest.raises(TuningError, match="not plain JSON"):
        trial(trace=[{"loop": object()}])
    with pytest.raises(TuningError, match="no median"):
        trial(median=None)
    with pytest.raises(TuningError, match="without a reason"):
        failed(reason=None)
    with pytest.raises(TuningError, match="thread count"):
        Key("znver4", "", "0.1.0", "22.1.0", 0)


def test_best_only_when_strictly_faster_than_the_default_under_the_same_key(db):
    assert db.best("t1", ZEN) is None
    db.add(trial(trace=TILE, median=5e-4))
    assert db.best("t1", ZEN) is None  # no default measured: nothing to beat
    db.add(trial(median=1e-3))
    assert db.best("t1", ZEN).trace == TILE
    db.add(trial(trace=SPLIT, median=4e-4))
    db.add(failed(trace=[{"op": "unroll", "loop": "k", "factor": 99}]))
    assert db.best("t1", ZEN).trace == SPLIT
    assert db.default("t1", ZEN).median_s == 1e-3

    db.add(trial(task="t2", median=1e-3))
    db.add(trial(task="t2", trace=TILE, median=1e-3))  # a tie is no speed-up
    db.add(trial(task="t2", trace=SPLIT, median=2e-3))
    assert db.best("t2", ZEN) is None

    other = Key(ZEN.cpu, ZEN.features, ZEN.polyonnx, ZEN.llvm, 2)
    assert db.best("t1", other) is None and db.default("t1", other) is None
    db.add(trial(median=1e-3, key=other))
    db.add(trial(trace=TILE, median=6e-4, key=other))
    assert db.best("t1", other).trace == TILE  # two threads: its own default, its own best
    assert db.best("t1", ZEN).trace == SPLIT


def test_measured_holds_every_trace_tried_for_resume(db):
    db.add(trial())
    db.add(failed(trace=TILE))
    db.add(trial(trace=[{"loop": "j", "factor": 16, "op": "split"}]))  # key order is no matter
    db.add(trial(task="t2", trace=[{"op": "other"}]))
    db.add(trial(trace=[{"op": "two threads"}], key=Key("znver4", "", "0.1.0", "22.1.0", 2)))
    assert db.measured("t1", ZEN) == {canonical([]), canonical(TILE), canonical(SPLIT)}
    assert canonical(SPLIT) == '[{"factor":16,"loop":"j","op":"split"}]'


def test_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "new.db"
    Database(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    conn.close()
    with pytest.raises(
        TuningError, match=f"schema version 99.*reads schema version {SCHEMA_VERSION}"
    ):
        Database(path)


def test_a_new_database_records_its_schema_version(tmp_path):
    Database(tmp_path / "a.db").close()
    conn = sqlite3.connect(tmp_path / "a.db")
    assert conn.execute("SELECT value FROM meta").fetchall() == [(str(SCHEMA_VERSION),)]
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


def test_files_that_are_not_tuning_databases_are_refused(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("these are not the records you are looking for\n" * 100)
    with pytest.raises(
        TuningError, match=r"notes\.db is not a polyonnx tuning database.*not an SQLite"
    ):
        Database(text)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE songs (title TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(TuningError, match=r"no 'meta' table.*songs"):
        Database(other)
    with pytest.raises(TuningError, match="no tuning database at"):
        Database(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_export_then_import_gives_the_same_trials_and_twice_adds_nothing(db, tmp_path):
    db.add(trial())
    db.add(failed(reason="wrong answer: max abs err 3.1 at [0, 4]"))
    db.add(trial(task="t2", trace=SPLIT, key=Key("skylake-avx512", "+avx512f", "0.1.0", "22", 2)))
    out = io.StringIO()
    assert db.export_jsonl(out) == 3
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and json.loads(lines[1])["reason"].startswith("wrong answer")

    with Database(tmp_path / "fresh.db") as fresh:
        assert fresh.import_jsonl(io.StringIO(out.getvalue())) == (3, 0)
        assert fresh.import_jsonl(io.StringIO(out.getvalue())) == (0, 3)
        assert fresh.trials("t1", ZEN) == db.trials("t1", ZEN)
        assert len(fresh) == 3
        part = io.StringIO()
        assert fresh.export_jsonl(part, tasks=["t2"]) == 1
        assert fresh.export_jsonl(io.StringIO(), key=ZEN) == 2


def test_a_malformed_line_is_named_and_nothing_is_imported(db):
    good = json.dumps(trial().to_json())
    no_key = trial().to_json()
    del no_key["key"]
    for bad, why in (("{not json", "line 3"), (json.dumps(no_key), "line 3.*no 'key'")):
        with pytest.raises(TuningError, match=why):
            db.import_jsonl(io.StringIO(f"{good}\n\n{bad}\n"))
    assert len(db) == 0


def test_lookup_applies_this_key_only_and_says_what_it_skipped(db):
    db.add(trial(task="t1"))
    db.add(trial(task="t1", trace=TILE, median=5e-4))
    sky = Key("skylake-avx512", "+avx512f", ZEN.polyonnx, ZEN.llvm, 1)
    for task in ("t1", "t2", "t3"):
        db.add(trial(task=task, key=sky))
        db.add(trial(task=task, trace=TILE, median=1e-4, key=sky))
    db.add(trial(task="t4", key=sky))  # not asked for: not reported
    old = Key(ZEN.cpu, ZEN.features, "0.0.9", ZEN.llvm, 1)
    db.add(trial(task="t2", key=old))
    db.add(trial(task="t2", trace=TILE, median=1e-5, key=old))

    chosen, skipped = db.lookup(["t1", "t2", "t3"], ZEN)
    assert set(chosen) == {"t1"} and chosen["t1"].trace == TILE
    assert skipped == [
        "6 records for 3 kernels measured on cpu 'skylake-avx512' (this is 'znver4')",
        "2 records for 1 kernel from polyonnx 0.0.9 (this is 0.1.0)",
    ]


def test_lookup_explains_feature_thread_and_llvm_mismatches(db):
    for key in (
        Key(ZEN.cpu, "+avx2,+fma", ZEN.polyonnx, ZEN.llvm, 1),
        Key(ZEN.cpu, ZEN.features, ZEN.polyonnx, "21.1.0", 1),
        Key(ZEN.cpu, ZEN.features, ZEN.polyonnx, ZEN.llvm, 2),
    ):
        db.add(trial(key=key))
    chosen, skipped = db.lookup(["t1"], ZEN)
    assert chosen == {}
    assert skipped == [
        "1 record for 1 kernel measured on cpu 'znver4' with other CPU features "
        "(here only: +avx512f)",
        "1 record for 1 kernel from LLVM 21.1.0 (this is 22.1.0)",
        "1 record for 1 kernel measured on 2 thread(s) (this run uses 1)",
    ]


def test_host_key_and_default_path():
    key = Key.host(2)
    assert key.threads == 2 and key.polyonnx == polyonnx.__version__
    assert key.cpu and key.llvm.count(".") == 2
    assert default_path("/models/resnet.onnx") == pathlib.Path("/models/polyonnx-tuning.db")


ZEN_WRITER = Key("znver4", "+avx512f", "0.1.0", "22.1.0", 1)
WRITER = textwrap.dedent(
    """
    import sys
    from polyonnx.tune.db import Database, Key, Trial

    key = Key("znver4", "+avx512f", "0.1.0", "22.1.0", 1)
    with Database(sys.argv[1]) as db:
        for n in range(100000):
            t = Trial("t1", "Conv", "Conv_0", [{"op": "tile", "n": n}], "ok", None,
                      1e-3, 1e-5, 5, key)
            db.add(t)
            print(t.uid, flush=True)
    """
)


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it, even when this test runs in a
    background job (whose shell made its children ignore SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_no_trial_is_lost_when_the_writer_is_killed(tmp_path, sig):
    path = tmp_path / "killed.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        printed = [writer.stdout.readline().strip() for _ in range(30)]
        assert all(printed), "the writer stopped early"
        with Database(path) as reader:  # a reader sees commits while the writer runs
            assert {t.uid for t in reader.trials("t1", ZEN_WRITER)} >= set(printed)
        writer.send_signal(sig)
        printed += writer.communicate(timeout=60)[0].split()  # a hang fails, not stalls
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode != 0
    with Database(path) as db:
        stored = {t.uid for t in db.trials("t1", ZEN_WRITER)}
        assert set(printed) <= stored
        assert len(stored) - len(printed) <= 1  # at most the one whose uid was not yet printed
        db.add(trial(key=ZEN_WRITER))
        assert len(db.trials("t1", ZEN_WRITER)) == len(stored) + 1


def test_a_trace_measured_twice_counts_by_its_slower_measurement(db):
    other = [{"kernel": "k", "primitive": "ukernel", "args": {"params": {"mr": 4}}}]
    db.add(trial(trace=[], median=1e-3))
    db.add(trial(trace=TILE, median=0.5e-3))  # a lucky run ...
    db.add(trial(trace=other, median=0.8e-3))
    assert db.best("t1", ZEN).trace == list(TILE)
    db.add(trial(trace=TILE, median=0.99e-3))  # ... that its confirmation does not repeat
    assert db.best("t1", ZEN).trace == other
    assert db.count("t1", ZEN, list(TILE)) == 2 and db.count("t1", ZEN, other) == 1
