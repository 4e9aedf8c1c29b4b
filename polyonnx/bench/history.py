"""The history directory: runs saved by pytest-benchmark (``--benchmark-autosave`` into
``--benchmark-storage``), one JSON file each, as
``<dir>/<Linux-CPython-3.11-64bit>/<NNNN>_<commit>_<date>[_uncommited-changes].json``.

A run names its commit (id, dirty flag, branch), its date and its machine; pytest-benchmark's
folder names only the OS and Python, so ``Machine`` (node, CPU, core count) is what keeps
series of different machines apart. Other JSON files in the directory (perf/report.py's
``report.json``, a written site) are not runs and are not read.
"""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass

from polyonnx.bench.cases import Measurement, measurement
from polyonnx.errors import PolyonnxError

RUN_FILE = re.compile(r"^(\d{4})_.*\.json$")


class HistoryError(PolyonnxError):
    """A run file is unreadable, or a run reference matches no run (or several)."""


@dataclass(frozen=True)
class Machine:
    node: str
    cpu: str
    cores: int
    arch: str

    @property
    def label(self) -> str:
        return f"{self.node} · {self.cpu} · {self.cores} cores · {self.arch}"

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", f"{self.node}-{self.cpu}-{self.cores}".lower()).strip("-")


@dataclass(frozen=True)
class Run:
    """One saved run. ``number`` is pytest-benchmark's counter (0 for a file not named
    ``NNNN_...``); ``peak`` the FMA peak per core in GFLOP/s the run recorded (None if it
    recorded none)."""

    path: pathlib.Path
    number: int
    datetime: str
    commit: str
    dirty: bool
    branch: str
    machine: Machine
    polyonnx_version: str | None
    llvm_version: str | None
    peak: float | None
    suite: str | None
    measurements: tuple[Measurement, ...]

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def short_commit(self) -> str:
        """The commit's first 7 hex digits, with a '+' when the tree had changes."""
        return self.commit[:7] + ("+" if self.dirty else "")

    @property
    def date(self) -> str:
        """The run's UTC date and time to the minute."""
        return self.datetime[:16].replace("T", " ")

    @property
    def label(self) -> str:
        return f"#{self.number} {self.short_commit} {self.date}"

    @property
    def has_data(self) -> bool:
        """Whether the run kept per-round times (``--benchmark-save-data``)."""
        return any(m.data for m in self.measurements)


def machine_of(info: dict) -> Machine:
    cpu = info.get("cpu") or {}
    return Machine(
        node=str(info.get("node") or "unknown"),
        cpu=str(cpu.get("brand_raw") or info.get("processor") or "unknown CPU"),
        cores=int(cpu.get("count") or 0),
        arch=str(info.get("machine") or cpu.get("arch") or "unknown"),
    )


def read_run(path: pathlib.Path) -> Run:
    """The run saved in ``path``; HistoryError if it is not a pytest-benchmark run."""
    try:
        data = json.loads(path.read_text(encoding="utf8"))
        found = RUN_FILE.match(path.name)
        commit = data.get("commit_info") or {}
        info = data["machine_info"]
        ours = info.get("polyonnx") or {}
        return Run(
            path=path,
            number=int(found[1]) if found else 0,
            datetime=str(data["datetime"]),
            commit=str(commit.get("id") or "unknown"),
            dirty=bool(commit.get("dirty")),
            branch=str(commit.get("branch") or ""),
            machine=machine_of(info),
            polyonnx_version=ours.get("version"),
            llvm_version=ours.get("llvm_version"),
            peak=ours.get("peak_gflops_per_core"),
            suite=data.get("suite"),
            measurements=tuple(measurement(bench) for bench in data["benchmarks"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HistoryError(f"{path} is not a readable pytest-benchmark run: {exc!r}") from exc


def run_files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.rglob("*.json") if RUN_FILE.match(p.name))


def load_history(directory: pathlib.Path) -> tuple[list[Run], list[str]]:
    """(the runs saved under ``directory``, oldest first; a note per file skipped)."""
    runs, skipped = [], []
    for path in run_files(directory):
        try:
            runs.append(read_run(path))
        except HistoryError as exc:
            skipped.append(str(exc))
    runs.sort(key=lambda run: (run.datetime, run.number, str(run.path)))
    return runs, skipped


def find_run(runs: list[Run], ref: str, machine: Machine | None = None) -> Run:
    """The run ``ref`` names: a file, ``last`` (the newest), a run number (``3`` or
    ``0003``: up to 4 digits), or a prefix of a run's file name or commit id. With
    ``machine``, only that machine's runs are considered; several matches give the
    newest."""
    path = pathlib.Path(ref)
    if path.suffix == ".json" and path.is_file():
        return read_run(path)
    pool = [run for run in runs if machine is None or run.machine == machine]
    if ref == "last":
        matches = pool
    elif ref.isdigit() and len(ref) <= 4:
        matches = [run for run in pool if run.number == int(ref)]
    else:
        matches = [run for run in pool if run.name.startswith(ref) or run.commit.startswith(ref)]
    if not matches:
        where = f" of {machine.label}" if machine else ""
        known = ", ".join(run.label for run in pool[-5:]) or "none"
        raise HistoryError(f"no run{where} matches {ref!r} (latest runs: {known})")
    return matches[-1]
