"""Tuning records in use: each kernel whose task has a record that beat the default gets
the record's schedule; every other kernel keeps the default heuristic's.

    records = Records.load(threads=2, db="polyonnx-tuning.db")   # + the shipped records
    schedules, used = records.schedules(program)

Records come from a tuning database and from the records shipped with polyonnx for this
CPU (tuning/, installed as polyonnx.tuning). Only records measured under this machine's
key (CPU, features, polyonnx and LLVM versions, thread count) apply; ``skipped`` says
which others there were, and why they were not used.

Only records the model-level A/B kept are used (tune/db.py, "Verdicts"): a task a
session has judged in the user's database is decided there alone, so a shipped record
the A/B dropped is not used either. A session choosing what its A/B tries loads them
with ``candidates=True``: every record not dropped.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Program
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.tree import KernelSchedule
from polyonnx.tune.db import Database, Key, Trial, canonical
from polyonnx.tune.runner import kernel_schedule
from polyonnx.tune.tasks import structural_hash

MARGIN = 0.97
"""A record applies only when its time is below this fraction of the default's (measured
alongside it, `Trial.ratio`): a smaller gain is within the noise of one measurement."""


@dataclass(frozen=True)
class Choice:
    """A task's record in use: the trial, the default it beat, the database it is from."""

    trial: Trial
    default: Trial
    db: Database


@dataclass
class Records:
    key: Key
    databases: list[Database] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    candidates: bool = False
    """Records a session's A/B may try (not dropped), instead of those it kept."""

    @staticmethod
    def load(
        threads: int,
        db: str | os.PathLike | None = None,
        shipped: bool = True,
        *,
        candidates: bool = False,
    ) -> Records:
        """Records for this machine running ``threads`` threads: from ``db`` (which must
        exist) and, with ``shipped``, those that come with polyonnx."""
        records = Records(Key.host(threads), candidates=candidates)
        if db is not None:
            records.databases.append(Database(db, create=False))
        if shipped:
            records.databases.extend(_shipped())
        return records

    def best(self, tasks: Iterable[str]) -> dict[str, Trial]:
        """Per task, the fastest record that beats its default by the margin."""
        return {task: choice.trial for task, choice in self.choices(tasks).items()}

    def choices(self, tasks: Iterable[str]) -> dict[str, Choice]:
        """Per task, the fastest record that beats its default by the margin, with its
        default and its database. The user's database comes first. It decides alone the
        tasks a session has judged in it; for a session's candidates, it only rules out
        the traces it dropped."""
        tasks = list(tasks)
        found: dict[str, Choice] = {}
        decided: set[str] = set()
        dropped: dict[str, set[str]] = {}
        for db in self.databases:
            open_tasks = [t for t in tasks if t not in decided]
            best, skipped = db.lookup(open_tasks, self.key, candidates=self.candidates)
            for reason in skipped:
                self._skip(f"{reason} ({_source(db)})")
            for task, trial in best.items():
                default = db.default(task, self.key)
                if canonical(trial.trace) in dropped.get(task, ()):
                    continue
                if default is not None and trial.ratio(default) < MARGIN:
                    found[task] = Choice(trial, default, db)
            decided |= set(found)
            for task in open_tasks:
                if self.candidates:
                    dropped.setdefault(task, set()).update(db.dropped(task, self.key))
                elif db.judged(task, self.key):
                    decided.add(task)
        return found

    def schedules(
        self, program: Program, defaults: Sequence[KernelSchedule] | None = None
    ) -> tuple[list[KernelSchedule], dict[str, Trial]]:
        """Each kernel's schedule, and the records used (by kernel name); ``defaults``:
        the kernels' default schedules, where the caller has them."""
        if defaults is None:
            defaults = [default_schedule(k, program.buffers) for k in program.kernels]
        defaults = {k.name: s for k, s in zip(program.kernels, defaults, strict=True)}
        if not self.databases:
            return list(defaults.values()), {}
        hashes = {k.name: structural_hash(k, program, defaults[k.name]) for k in program.kernels}
        best = self.best(set(hashes.values()))
        schedules, used = [], {}
        for kernel in program.kernels:
            trial = best.get(hashes[kernel.name])
            if trial is not None:
                try:
                    schedules.append(kernel_schedule(program, kernel.name, trial.trace))
                    used[kernel.name] = trial
                    continue
                except (ScheduleError, KeyError, TypeError, ValueError) as exc:
                    self._skip(f"record for {kernel.name} does not apply: {exc!r}")
            schedules.append(defaults[kernel.name])
        return schedules, used

    def fingerprint(self) -> list:
        """What identifies the records in force, for the compile cache: the key, and the
        path, size and modification time of each database's files (a database's
        write-ahead log too; the shipped files for the shipped records)."""
        paths = [db.path for db in self.databases if str(db.path) != ":memory:"]
        paths = [file for p in paths for file in (p, p.with_name(p.name + "-wal"))]
        if any(str(db.path) == ":memory:" for db in self.databases):
            paths += shipped_files()
        return [dataclasses.asdict(self.key), *(_stamp(p) for p in paths)]

    def _skip(self, reason: str) -> None:
        if reason not in self.skipped:  # once, however many compiles ask
            self.skipped.append(reason)

    def close(self) -> None:
        """Close the databases this object opened (the shipped records stay loaded)."""
        for db in self.databases:
            if db not in (_SHIPPED or []):
                db.close()


def _stamp(path: pathlib.Path) -> tuple[str, int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def _source(db: Database) -> str:
    return "shipped records" if str(db.path) == ":memory:" else str(db.path)


def shipped_files() -> list[pathlib.Path]:
    """The JSON-lines files of records that come with polyonnx."""
    try:
        folder = resources.files("polyonnx.tuning")
    except ModuleNotFoundError:
        return []
    return sorted(pathlib.Path(str(f)) for f in folder.iterdir() if str(f).endswith(".jsonl"))


_SHIPPED: list[Database] | None = None


def _shipped() -> list[Database]:
    """The shipped records, read once per process into an in-memory database."""
    global _SHIPPED
    if _SHIPPED is None:
        db = Database(":memory:")
        for path in shipped_files():
            with open(path) as src:
                db.import_jsonl(src)
        _SHIPPED = [db] if len(db) else []
    return _SHIPPED
