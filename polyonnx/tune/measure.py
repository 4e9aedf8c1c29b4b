"""Measurement in worker subprocesses: a candidate that crashes, hangs or fails to
compile becomes a failed result with its reason, and the session goes on.

    with Workers(jobs=1, timeout=60) as workers:
        for job, result in workers.run(jobs):     # Job -> Measurement, as each finishes
            ...

Each worker (tune/worker.py) keeps its lowered model and its reference outputs between
jobs. A worker that dies is replaced; the job it was running is reported with the signal
that killed it ("crashed: signal SIGSEGV"), one that overruns its time limit is killed
("timeout after 60 s"). Workers run in their own session, so Ctrl-C in the terminal
reaches only the tuner, which then stops them.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from polyonnx.tune.runner import Measurement

STARTUP_SECONDS = 300.0
"""Time for a worker to get ready for a job (imports, lowering the model, the default's
reference outputs) before the job's own time limit starts."""
READY = "ready"


@dataclass(frozen=True)
class Job:
    model: str
    kernel: str
    trace: Sequence[Mapping]
    threads: int
    shapes: Mapping[str, Sequence[int]] | None = None
    min_seconds: float = 0.05
    tag: object = field(default=None, compare=False)
    """The caller's own data, handed back with the result."""


class Workers:
    """Up to ``jobs`` worker subprocesses that build and time candidates; each job has
    ``timeout`` seconds once its worker is ready for it."""

    def __init__(self, jobs: int = 1, timeout: float = 60.0, env: Mapping[str, str] | None = None):
        self.slots = max(int(jobs), 1)
        self.timeout = timeout
        self.env = {**os.environ, **(env or {})}
        self._seq = 0
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._logs = tempfile.TemporaryDirectory(prefix="polyonnx-workers-")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker, busy or idle."""
        for worker in self._all:
            worker.stop()
            worker.log.close()
        self._all.clear()
        self._idle.clear()
        self._logs.cleanup()

    def run(
        self, jobs: Iterable[Job], deadline: float | None = None
    ) -> Iterator[tuple[Job, Measurement]]:
        """Run ``jobs`` on up to ``slots`` workers at once; yield each with its result as
        it finishes (not necessarily in order). No job starts after ``deadline`` (a
        time.monotonic() value); those are not yielded."""
        pending = list(jobs)
        busy: dict[int, _Busy] = {}
        selector = selectors.DefaultSelector()
        try:
            while busy or (pending and (deadline is None or time.monotonic() < deadline)):
                while pending and len(busy) < self.slots:
                    if deadline is not None and time.monotonic() >= deadline:
                        pending.clear()
                        break
                    job = pending.pop(0)
                    worker = self._send(job)
                    now = time.monotonic()
                    busy[worker.fd] = _Busy(worker, job, now + STARTUP_SECONDS, now)
                    selector.register(worker.fd, selectors.EVENT_READ)
                if not busy:
                    break
                soonest = min(b.deadline for b in busy.values())
                events = selector.select(max(soonest - time.monotonic(), 0.0))
                ready = {key.fd for key, _ in events}
                now = time.monotonic()
                for fd in list(busy):
                    item = busy[fd]
                    if fd not in ready and now < item.deadline:
                        continue
                    result = item.worker.receive() if fd in ready else None
                    if result == READY:  # prepared: the candidate's own time limit starts
                        item.ready, item.deadline = True, now + self.timeout
                        continue
                    selector.unregister(fd)
                    del busy[fd]
                    if result is None:
                        result = self._failure(item, ended=fd in ready)
                    else:
                        self._idle.append(item.worker)
                    yield item.job, replace(result, wall_s=time.monotonic() - item.sent)
        finally:
            for item in busy.values():
                item.worker.stop()
            selector.close()

    def _send(self, job: Job) -> _Worker:
        """An idle worker (or a new one) with ``job`` sent to it."""
        self._seq += 1
        while self._idle:
            worker = self._idle.pop()
            try:
                worker.send(job, self._seq)
                return worker
            except OSError:  # it died while idle
                worker.stop()
        worker = self._start()
        worker.send(job, self._seq)
        return worker

    def _start(self) -> _Worker:
        log = open(os.path.join(self._logs.name, f"worker-{len(self._all)}.log"), "w+b")  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "-m", "polyonnx.tune.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=self.env,
            start_new_session=True,
            bufsize=0,  # unbuffered: select() must see every line the worker wrote
        )
        worker = _Worker(process, log)
        self._all.append(worker)
        return worker

    def _failure(self, item: _Busy, ended: bool) -> Measurement:
        worker = item.worker
        if not ended:
            worker.stop()
            if not item.ready:
                return Measurement(
                    "failed",
                    f"timeout after {STARTUP_SECONDS:g} s preparing: lowering the model or "
                    f"running the default schedule",
                )
            return Measurement("failed", f"timeout after {self.timeout:g} s")
        code = worker.stop()
        if code is not None and code < 0:
            reason = f"crashed: signal {signal.Signals(-code).name}"
        else:
            reason = f"worker exited with code {code}"
        last = worker.last_error()
        return Measurement("failed", f"{reason}{': ' + last if last else ''}")


@dataclass
class _Busy:
    worker: _Worker
    job: Job
    deadline: float
    sent: float
    ready: bool = False


class _Worker:
    def __init__(self, process: subprocess.Popen, log):
        self.process = process
        self.log = log
        self.fd = process.stdout.fileno()
        self.log_start = 0
        """Where the current job's part of the worker's stderr log begins."""

    def send(self, job: Job, seq: int) -> None:
        message = {
            "seq": seq,
            "model": job.model,
            "shapes": dict(job.shapes or {}),
            "kernel": job.kernel,
            "trace": list(job.trace),
            "threads": job.threads,
            "min_seconds": job.min_seconds,
        }
        self.log_start = os.fstat(self.log.fileno()).st_size
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def receive(self) -> Measurement | str | None:
        """The next message: a result, READY, or None when the worker is gone."""
        line = self.process.stdout.readline()
        if not line:
            return None
        data = json.loads(line)
        data.pop("seq", None)
        if data.get("ready"):
            return READY
        return Measurement(**data)

    def stop(self) -> int | None:
        """Kill the worker (if still running); its exit code, negative for a signal."""
        if self.process.poll() is None:
            self.process.kill()
        code = self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        return code

    def last_error(self) -> str:
        """The last line the worker wrote to stderr during its last job (a Python
        traceback's message), and the log closed."""
        self.log.flush()
        self.log.seek(self.log_start)
        text = self.log.read().decode(errors="replace")
        self.log.close()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""
