"""The tuning database: every measured trial, in one SQLite file, committed as it finishes.

A *trial* is one schedule trace of one tuning task (a kernel structural hash) measured on one
machine: its median time and spread, or why it failed. A trial applies only under the same
`Key` — CPU name, CPU features, polyonnx version, LLVM version and thread count — so records
measured elsewhere are never used silently: `Database.lookup` says which ones it skipped, and
why.

Durability. Each `Database.add` is one INSERT in autocommit mode: when it returns, the trial is
committed, and another process opening the file sees it. The journal is a write-ahead log
(``journal_mode=WAL``), so readers (``polyonnx run``) never block the tuner that writes, and a
writer killed mid-transaction leaves the file consistent (the torn WAL tail is discarded on the
next open). We use ``synchronous=FULL``: WAL with NORMAL already survives a killed process
(committed frames are in the OS page cache), but FULL also fsyncs the WAL at every commit, so a
trial survives a power loss or kernel panic too. One fsync (~1 ms) per trial is noise next to
what a trial costs (compiling and timing a kernel), and imports insert in one transaction.
WAL needs shared memory between processes, so the file must be on a local file system.

Schema (version `SCHEMA_VERSION`)::

    meta(name TEXT PRIMARY KEY, value TEXT)          -- ('schema_version', '2')
    trials(id INTEGER PRIMARY KEY AUTOINCREMENT,      -- insertion order
           uid TEXT UNIQUE, task, op_type, kernel,
           trace TEXT,                                -- canonical JSON of the schedule trace
           status, reason, median_s, spread_s, repeats,
           baseline_s,                                -- the default's median, interleaved
           cpu, features, polyonnx, llvm, threads,    -- the Key
           model, session, created,
           verdict, verdict_reason)                   -- the model-level A/B's (below)
    index trials_by_key on trials(task, cpu, features, polyonnx, llvm, threads)

Verdicts. A tuned trace is used by ``polyonnx run`` only if the model got faster with it:
every session ends with a model-level A/B (tune/verdict.py) and writes its verdict on every
row of the trace. ``verdict`` is NULL for a trial no session of schema 2 has judged (an
old database's, or an import without the field: the old rule, faster than the default at
kernel level, applies), ``'pending'`` for one a session measured and has not judged yet
(a session stopped before its A/B), ``'kept'`` when the A/B kept it, ``'dropped'`` (with
``verdict_reason``) when the model was not faster beyond the measured noise with it. A task
with any verdict on a tuned row is *judged* here: only its kept traces are used
(`Database.best`). Version 1 files gain the two columns when opened (`_migrate`).

Export and import move trials as JSON lines, one `Trial.to_json` object per line; a trial's
``uid`` makes import idempotent.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO
from uuid import uuid4

from polyonnx.errors import TuningError

SCHEMA_VERSION = 2
DEFAULT_NAME = "polyonnx-tuning.db"
STATUSES = ("ok", "failed")
VERDICTS = (None, "pending", "kept", "dropped")
_VERDICT_COLUMNS = (
    "verdict TEXT CHECK (verdict IN ('pending', 'kept', 'dropped'))",
    "verdict_reason TEXT",
)

_SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE trials (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        uid TEXT NOT NULL UNIQUE,
        task TEXT NOT NULL,
        op_type TEXT NOT NULL,
        kernel TEXT NOT NULL,
        trace TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
        reason TEXT,
        median_s REAL,
        spread_s REAL,
        repeats INTEGER NOT NULL,
        baseline_s REAL,
        cpu TEXT NOT NULL,
        features TEXT NOT NULL,
        polyonnx TEXT NOT NULL,
        llvm TEXT NOT NULL,
        threads INTEGER NOT NULL,
        model TEXT NOT NULL,
        session TEXT NOT NULL,
        created REAL NOT NULL,
        {_VERDICT_COLUMNS[0]},
        {_VERDICT_COLUMNS[1]}
    )""",
    "CREATE INDEX trials_by_key ON trials (task, cpu, features, polyonnx, llvm, threads)",
)

_COLUMNS = (
    "uid, task, op_type, kernel, trace, status, reason, median_s, spread_s, repeats, "
    "baseline_s, cpu, features, polyonnx, llvm, threads, model, session, created, "
    "verdict, verdict_reason"
)
_INSERT = f"INSERT OR IGNORE INTO trials ({_COLUMNS}) VALUES ({', '.join('?' * 21)})"
_KEY_MATCH = "task = ? AND cpu = ? AND features = ? AND polyonnx = ? AND llvm = ? AND threads = ?"


def canonical(trace: list[dict]) -> str:
    """The one JSON spelling of a trace: sorted keys, no spaces. Equal traces, equal strings."""
    return json.dumps(trace, sort_keys=True, separators=(",", ":"), allow_nan=False)


def default_path(model: str | os.PathLike) -> pathlib.Path:
    """Where ``polyonnx tune`` keeps a model's trials unless told otherwise: beside the model."""
    return pathlib.Path(model).parent / DEFAULT_NAME


@dataclass(frozen=True)
class Key:
    """What must be equal for a measured time to mean anything here."""

    cpu: str
    features: str
    polyonnx: str
    llvm: str
    threads: int

    def __post_init__(self):
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise TuningError(f"a tuning key needs a thread count >= 1, got {self.threads!r}")

    @staticmethod
    def host(threads: int) -> Key:
        """This machine, this polyonnx, this LLVM, running on ``threads`` threads."""
        from polyonnx import __version__
        from polyonnx.target import host_target, llvm_version

        target = host_target()
        return Key(target.name, target.features, __version__, llvm_version(), threads)


@dataclass(frozen=True)
class Trial:
    """One trace of one task, measured (``status == "ok"``) or failed with a ``reason``.

    The trace is normalised to plain JSON at construction (tuples become lists), so a trial
    read back from the database is equal to the one added.
    """

    task: str
    op_type: str
    kernel: str
    trace: list[dict]
    status: str
    reason: str | None
    median_s: float | None
    spread_s: float | None
    repeats: int
    key: Key
    model: str = ""
    session: str = ""
    baseline_s: float | None = None
    """The default schedule's median in the same measurement, its runs interleaved with
    the trial's: the speed-up ``baseline_s / median_s`` does not drift with the machine's
    load the way two separate measurements do."""
    uid: str = field(default_factory=lambda: uuid4().hex)
    created: float = field(default_factory=time.time)
    verdict: str | None = None
    """The model-level A/B's verdict on this trace (module docstring, "Verdicts"): None
    (never judged), "pending", "kept" or "dropped"."""
    verdict_reason: str | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise TuningError(f"trial status must be 'ok' or 'failed', got {self.status!r}")
        if self.verdict not in VERDICTS:
            raise TuningError(
                f"trial {self.uid}: verdict must be pending, kept, dropped or null, "
                f"got {self.verdict!r}"
            )
        if self.verdict_reason is not None and not isinstance(self.verdict_reason, str):
            raise TuningError(f"trial {self.uid}: verdict_reason must be text")
        if self.status == "ok" and self.median_s is None:
            raise TuningError(f"trial {self.uid} of task {self.task} is ok but has no median")
        if self.status == "failed" and not self.reason:
            raise TuningError(f"trial {self.uid} of task {self.task} failed without a reason")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 0:
            raise TuningError(f"trial {self.uid}: repeats must be a count, got {self.repeats!r}")
        for name in ("median_s", "spread_s", "baseline_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise TuningError(f"trial {self.uid}: {name} must be a finite time, got {value}")
        if not isinstance(self.trace, list):
            raise TuningError(f"trial {self.uid}: a trace is a list of steps, got {self.trace!r}")
        try:
            plain = json.loads(canonical(self.trace))
        except (TypeError, ValueError) as err:
            raise TuningError(f"trial {self.uid}: the trace is not plain JSON: {err}") from None
        object.__setattr__(self, "trace", plain)

    @property
    def is_default(self) -> bool:
        """Measured with the default heuristic schedule (the empty trace)."""
        return self.trace == []

    def ratio(self, default: Trial) -> float:
        """This trial's time over the default schedule's: against its own interleaved
        baseline where it has one, else against ``default``'s separate measurement."""
        if self.baseline_s:
            return self.median_s / self.baseline_s
        return self.median_s / default.median_s

    def to_json(self) -> dict:
        """The trial as one JSON object: the export line format."""
        return {
            "uid": self.uid,
            "task": self.task,
            "op_type": self.op_type,
            "kernel": self.kernel,
            "trace": self.trace,
            "status": self.status,
            "reason": self.reason,
            "median_s": self.median_s,
            "spread_s": self.spread_s,
            "repeats": self.repeats,
            "baseline_s": self.baseline_s,
            "key": {
                "cpu": self.key.cpu,
                "features": self.key.features,
                "polyonnx": self.key.polyonnx,
                "llvm": self.key.llvm,
                "threads": self.key.threads,
            },
            "model": self.model,
            "session": self.session,
            "created": self.created,
            "verdict": self.verdict,
            "verdict_reason": self.verdict_reason,
        }

    @staticmethod
    def from_json(obj: dict) -> Trial:
        """Inverse of `to_json`. Missing or ill-typed fields raise TuningError."""
        if not isinstance(obj, dict):
            raise TuningError(f"a trial is a JSON object, got {type(obj).__name__}")
        key = obj.get("key")
        if not isinstance(key, dict):
            raise TuningError("the trial has no 'key' object")
        try:
            return Trial(
                task=_field(obj, "task", str),
                op_type=_field(obj, "op_type", str),
                kernel=_field(obj, "kernel", str),
                trace=_field(obj, "trace", list),
                status=_field(obj, "status", str),
                reason=obj.get("reason"),
                median_s=obj.get("median_s"),
                spread_s=obj.get("spread_s"),
                repeats=_field(obj, "repeats", int),
                baseline_s=obj.get("baseline_s"),
                key=Key(
                    _field(key, "cpu", str),
                    _field(key, "features", str),
                    _field(key, "polyonnx", str),
                    _field(key, "llvm", str),
                    _field(key, "threads", int),
                ),
                model=obj.get("model", ""),
                session=obj.get("session", ""),
                uid=_field(obj, "uid", str),
                created=_field(obj, "created", (int, float)),
                verdict=obj.get("verdict"),
                verdict_reason=obj.get("verdict_reason"),
            )
        except TypeError as err:  # e.g. a median that is a string
            raise TuningError(f"the trial has a field of the wrong type: {err}") from None


def _field(obj: dict, name: str, kind: type | tuple[type, ...]):
    if name not in obj:
        raise TuningError(f"the trial has no {name!r} field")
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TuningError(f"the trial's {name!r} field is {value!r}")
    return value


class Database:
    """Trials of every task, in one SQLite file shared by tuner and runs.

    Opening creates the file (unless ``create=False``) or checks its schema version. One
    instance may be used from several threads; several processes may open the same file.
    """

    def __init__(self, path: str | os.PathLike, *, create: bool = True):
        self.path = pathlib.Path(path)
        if not create and not self.path.exists():
            raise TuningError(f"there is no tuning database at {self.path}")
        self._lock = threading.RLock()
        """Reentrant: a KeyboardInterrupt between a ``_sql`` block taking the lock and its
        ``with`` taking charge of releasing it leaves the lock held by this thread, and
        ``__exit__``'s close must still get it (a writer stopped by Ctrl-C hung there)."""
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as err:
            raise TuningError(f"cannot open the tuning database {self.path}: {err}") from None
        try:
            self._open()
        except sqlite3.DatabaseError as err:
            self._conn.close()
            if err.sqlite_errorname == "SQLITE_NOTADB":
                raise TuningError(
                    f"{self.path} is not a polyonnx tuning database: it is not an SQLite file"
                ) from None
            raise TuningError(f"cannot open the tuning database {self.path}: {err}") from None
        except BaseException:
            self._conn.close()
            raise

    def _open(self) -> None:
        """Write the schema into a new file, check an old file's version; then switch to WAL."""
        conn = self._conn
        if not self._tables():
            conn.execute("BEGIN IMMEDIATE")  # two processes creating one file: one writes it
            try:
                if not self._tables():
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        tables = self._tables()
        if "meta" not in tables:
            raise TuningError(
                f"{self.path} is an SQLite database but not a polyonnx tuning database "
                f"(no 'meta' table; its tables: {', '.join(sorted(tables))})"
            )
        self._migrate()
        self._check_version()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")

    def _tables(self) -> set[str]:
        return {row[0] for row in self._conn.execute("SELECT name FROM sqlite_master")}

    def _version(self) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        return None if row is None else row[0]

    def _migrate(self) -> None:
        """Bring a version 1 file to version 2: the verdict columns, NULL on every old
        trial (never judged: the old rule applies to them until a session judges them)."""
        if self._version() != "1":
            return
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")  # two processes opening one old file: one migrates
        try:
            if self._version() == "1":
                for column in _VERDICT_COLUMNS:
                    conn.execute(f"ALTER TABLE trials ADD COLUMN {column}")
                conn.execute(
                    "UPDATE meta SET value = ? WHERE name = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _check_version(self) -> None:
        row = self._conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        if row is None:
            raise TuningError(f"{self.path} has no schema_version in its meta table")
        if row[0] != str(SCHEMA_VERSION):
            raise TuningError(
                f"{self.path} has tuning database schema version {row[0]}; this polyonnx "
                f"reads schema version {SCHEMA_VERSION} only (and migrates version 1; another "
                "polyonnx version wrote it)"
            )

    @contextmanager
    def _sql(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, with SQLite errors turned into TuningError."""
        with self._lock:
            try:
                yield self._conn
            except sqlite3.Error as err:
                raise TuningError(f"tuning database {self.path}: {err}") from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        with self._sql() as conn:
            return conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]

    def add(self, trial: Trial) -> None:
        """Store one trial; committed when this returns. A uid already stored is ignored."""
        with self._sql() as conn:
            conn.execute(_INSERT, _row(trial))

    def trials(self, task: str, key: Key) -> list[Trial]:
        """Every trial of ``task`` under ``key``, in insertion order."""
        with self._sql() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM trials WHERE {_KEY_MATCH} ORDER BY id",
                _key_params(task, key),
            ).fetchall()
        return [_trial(row) for row in rows]

    def measured(self, task: str, key: Key) -> set[str]:
        """Canonical JSON of every trace of ``task`` tried under ``key``, ok or failed."""
        with self._sql() as conn:
            rows = conn.execute(
                f"SELECT DISTINCT trace FROM trials WHERE {_KEY_MATCH}", _key_params(task, key)
            ).fetchall()
        return {row[0] for row in rows}

    def default(self, task: str, key: Key) -> Trial | None:
        """The latest ok trial of the default schedule (empty trace) of ``task`` under ``key``."""
        with self._sql() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM trials WHERE {_KEY_MATCH} "
                "AND status = 'ok' AND trace = '[]' ORDER BY id DESC LIMIT 1",
                _key_params(task, key),
            ).fetchone()
        return None if row is None else _trial(row)

    def best(self, task: str, key: Key, *, candidates: bool = False) -> Trial | None:
        """The ok tuned trial with the smallest time relative to the default (`Trial.ratio`),
        if that is below 1, among the traces ``polyonnx run`` may use: a judged task's kept
        traces, an unjudged task's every trace (module docstring, "Verdicts"). With
        ``candidates`` (a session choosing what its A/B tries): every trace not dropped.
        A trace measured several times is judged by its slowest measurement (a lucky run is
        not a speed-up).

        None when the default schedule was never measured ok under ``key``, or when no
        such trace is strictly faster: only schedules measured faster are ever applied.
        Ties go to the earlier trial.
        """
        base = self.default(task, key)
        if base is None:
            return None
        by_trace = self._tuned(task, key)
        judged = any(t.verdict is not None for trials in by_trace.values() for t in trials)
        usable = [
            trials for trials in by_trace.values()
            if _usable(trace_verdict(trials), judged, candidates)
        ]  # fmt: skip
        if not usable:
            return None
        # a trace measured more than once counts by its slowest measurement
        worst = [max(trials, key=lambda t: t.ratio(base)) for trials in usable]
        fastest = min(worst, key=lambda t: t.ratio(base))
        return fastest if fastest.ratio(base) < 1 else None

    def judged(self, task: str, key: Key) -> bool:
        """Whether a session has judged (or is judging) ``task``'s tuned traces here: then
        only this database decides which of its records are used."""
        with self._sql() as conn:
            row = conn.execute(
                f"SELECT 1 FROM trials WHERE {_KEY_MATCH} AND trace != '[]' "
                "AND verdict IS NOT NULL LIMIT 1",
                _key_params(task, key),
            ).fetchone()
        return row is not None

    def dropped(self, task: str, key: Key) -> set[str]:
        """Canonical JSON of every trace of ``task`` the A/B dropped under ``key``."""
        with self._sql() as conn:
            rows = conn.execute(
                f"SELECT DISTINCT trace FROM trials WHERE {_KEY_MATCH} AND verdict = 'dropped'",
                _key_params(task, key),
            ).fetchall()
        return {row[0] for row in rows}

    def _tuned(self, task: str, key: Key) -> dict[str, list[Trial]]:
        """The ok tuned trials of ``task`` under ``key``, by canonical trace."""
        with self._sql() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM trials WHERE {_KEY_MATCH} "
                "AND status = 'ok' AND trace != '[]' ORDER BY id",
                _key_params(task, key),
            ).fetchall()
        by_trace: dict[str, list[Trial]] = {}
        for row in rows:
            trial = _trial(row)
            by_trace.setdefault(canonical(trial.trace), []).append(trial)
        return by_trace

    def judge(
        self, key: Key, tasks: Iterable[str], verdicts: Iterable[Verdict], session: str = ""
    ) -> None:
        """Write a session's A/B verdicts, in one transaction. Every tuned trace of
        ``tasks`` that was kept or never judged becomes pending first, so afterwards the
        kept traces are exactly the ``verdicts`` kept: the set the A/B measured. A verdict
        on a trial from elsewhere (the shipped records) copies it, and its default where
        this database has none, in here first."""
        with self._sql() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for task in dict.fromkeys(tasks):
                    conn.execute(
                        "UPDATE trials SET verdict = 'pending', verdict_reason = NULL "
                        f"WHERE {_KEY_MATCH} AND trace != '[]' "
                        "AND (verdict IS NULL OR verdict = 'kept')",
                        _key_params(task, key),
                    )
                for v in verdicts:
                    self._judge_one(conn, key, v, session)
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    @staticmethod
    def _judge_one(conn: sqlite3.Connection, key: Key, v: Verdict, session: str) -> None:
        if v.verdict not in ("kept", "dropped"):
            raise TuningError(f"a verdict is 'kept' or 'dropped', got {v.verdict!r}")
        trial = v.trial
        conn.execute(_INSERT, _row(trial))  # ignored when the trial is here already
        if v.default is not None:
            has_default = conn.execute(
                f"SELECT 1 FROM trials WHERE {_KEY_MATCH} AND status = 'ok' AND trace = '[]'",
                _key_params(trial.task, key),
            ).fetchone()
            if has_default is None:
                conn.execute(_INSERT, _row(v.default))
        reason = v.reason + (f" (session {session})" if session else "")
        conn.execute(
            f"UPDATE trials SET verdict = ?, verdict_reason = ? WHERE {_KEY_MATCH} AND trace = ?",
            (v.verdict, reason, *_key_params(trial.task, key), canonical(trial.trace)),
        )

    def count(self, task: str, key: Key, trace: list[dict]) -> int:
        """How many ok measurements of ``trace`` ``task`` has under ``key``."""
        with self._sql() as conn:
            row = conn.execute(
                f"SELECT COUNT(*) FROM trials WHERE {_KEY_MATCH} AND status = 'ok' AND trace = ?",
                (*_key_params(task, key), canonical(trace)),
            ).fetchone()
        return row[0]

    def lookup(
        self, tasks: Iterable[str], key: Key, *, candidates: bool = False
    ) -> tuple[dict[str, Trial], list[str]]:
        """The best trial of each task where one applies (`best`, ``candidates`` passed on),
        and why other records were skipped.

        Records of these tasks measured under another key are never applied; each reason line
        names the first part of the key that differs (cpu, features, polyonnx, LLVM, threads)
        and counts the records and kernels, e.g. "12 records for 3 kernels measured on cpu
        'skylake-avx512' (this is 'znver4')".
        """
        chosen: dict[str, Trial] = {}
        skipped: dict[tuple[int, str], tuple[int, set[str]]] = {}
        for task in dict.fromkeys(tasks):
            trial = self.best(task, key, candidates=candidates)
            if trial is not None:
                chosen[task] = trial
            with self._sql() as conn:
                groups = conn.execute(
                    "SELECT cpu, features, polyonnx, llvm, threads, COUNT(*) FROM trials "
                    "WHERE task = ? GROUP BY cpu, features, polyonnx, llvm, threads",
                    (task,),
                ).fetchall()
            for *parts, count in groups:
                why = _mismatch(Key(*parts), key)
                if why is None:
                    continue
                records, kernels = skipped.get(why, (0, set()))
                skipped[why] = (records + count, kernels | {task})
        reasons = []
        for (_, why), (records, kernels) in sorted(skipped.items()):
            reasons.append(
                f"{_count(records, 'record')} for {_count(len(kernels), 'kernel')} {why}"
            )
        return chosen, reasons

    def export_jsonl(
        self, out: TextIO, tasks: Iterable[str] | None = None, key: Key | None = None
    ) -> int:
        """Write trials (of ``tasks``, under ``key``, when given) as JSON lines; return how many."""
        wanted = None if tasks is None else set(tasks)
        with self._sql() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM trials ORDER BY id").fetchall()
        written = 0
        for row in rows:
            trial = _trial(row)
            if wanted is not None and trial.task not in wanted:
                continue
            if key is not None and trial.key != key:
                continue
            out.write(json.dumps(trial.to_json(), sort_keys=True, allow_nan=False) + "\n")
            written += 1
        return written

    def import_jsonl(self, src: TextIO) -> tuple[int, int]:
        """Add the trials of a JSON-lines export; return (added, already present).

        All or nothing: every line is checked before any is stored, and a malformed one raises
        TuningError naming its line number. Trials whose uid is stored already are not added
        again, so importing a file twice adds nothing the second time.
        """
        trials = []
        for number, line in enumerate(src, start=1):
            if not line.strip():
                continue
            try:
                trials.append(Trial.from_json(json.loads(line)))
            except (ValueError, TuningError) as err:
                raise TuningError(f"line {number} is not a polyonnx tuning record: {err}") from None
        added = 0
        with self._sql() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for trial in trials:
                    added += conn.execute(_INSERT, _row(trial)).rowcount
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        return added, len(trials) - added


_KEY_PARTS = (
    ("cpu", "measured on cpu {there!r} (this is {here!r})"),
    ("features", "measured on cpu {cpu!r} with other CPU features ({diff})"),
    ("polyonnx", "from polyonnx {there} (this is {here})"),
    ("llvm", "from LLVM {there} (this is {here})"),
    ("threads", "measured on {there} thread(s) (this run uses {here})"),
)


def _mismatch(record: Key, key: Key) -> tuple[int, str] | None:
    """(rank, reason) for the first part of ``record`` that differs from ``key``; None if equal."""
    for rank, (name, template) in enumerate(_KEY_PARTS):
        there, here = getattr(record, name), getattr(key, name)
        if there != here:
            diff = _feature_diff(record.features, key.features) if name == "features" else ""
            return rank, template.format(there=there, here=here, cpu=record.cpu, diff=diff)
    return None


def _feature_diff(there: str, here: str) -> str:
    """What one feature string has that the other lacks, in a few words."""
    a, b = set(there.split(",")) - {""}, set(here.split(",")) - {""}
    parts = []
    for label, items in (("there only", a - b), ("here only", b - a)):
        if items:
            shown = sorted(items)
            more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
            parts.append(f"{label}: {', '.join(shown[:4])}{more}")
    return "; ".join(parts) or "same flags, other order"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True)
class Verdict:
    """The A/B's word on one tuned trace: "kept" or "dropped", and why. ``default``: the
    default trial its speed-up was measured against, copied in with a trial from
    elsewhere."""

    trial: Trial
    verdict: str
    reason: str
    default: Trial | None = None


def trace_verdict(trials: Iterable[Trial]) -> str | None:
    """One trace's verdict from its rows: dropped if any row is, else pending if any is,
    else kept if any is, else None (never judged)."""
    verdicts = {t.verdict for t in trials}
    for verdict in ("dropped", "pending", "kept"):
        if verdict in verdicts:
            return verdict
    return None


def _usable(verdict: str | None, judged: bool, candidates: bool) -> bool:
    """Whether a trace with ``verdict`` may be chosen: by a session (``candidates``), if
    not dropped; by a run, if kept, or never judged in a task never judged."""
    if candidates:
        return verdict != "dropped"
    return verdict == "kept" or (verdict is None and not judged)


def _key_params(task: str, key: Key) -> tuple:
    return (task, key.cpu, key.features, key.polyonnx, key.llvm, key.threads)


def _row(trial: Trial) -> tuple:
    k = trial.key
    return (
        trial.uid,
        trial.task,
        trial.op_type,
        trial.kernel,
        canonical(trial.trace),
        trial.status,
        trial.reason,
        trial.median_s,
        trial.spread_s,
        trial.repeats,
        trial.baseline_s,
        k.cpu,
        k.features,
        k.polyonnx,
        k.llvm,
        k.threads,
        trial.model,
        trial.session,
        trial.created,
        trial.verdict,
        trial.verdict_reason,
    )


def _trial(row: tuple) -> Trial:
    (uid, task, op_type, kernel, trace, status, reason, median, spread, repeats) = row[:10]
    baseline, cpu, features, version, llvm, threads, model, session, created = row[10:19]
    verdict, verdict_reason = row[19:]
    return Trial(
        task=task,
        op_type=op_type,
        kernel=kernel,
        trace=json.loads(trace),
        status=status,
        reason=reason,
        median_s=median,
        spread_s=spread,
        repeats=repeats,
        baseline_s=baseline,
        key=Key(cpu, features, version, llvm, threads),
        model=model,
        session=session,
        uid=uid,
        created=created,
        verdict=verdict,
        verdict_reason=verdict_reason,
    )
