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
    def __init__(self, jobs: int = 1, timeout: float = 60.0, env: Mapping[str, str] | None = None):
        self.slots = max(int(jobs), 1)
        self.timeout = timeout
        self.env = {**os.environ, **(env or {})}
        self._seq = 0
        self._idle: list[_Worker] = []
        self._logs = tempfile.TemporaryDirectory(prefix="polyonnx-workers-")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._idle:
            worker.stop()
            worker.log.close()
        self._idle.clear()
        self._logs.cleanup()

    def run(self, jobs: Iterable[Job]) -> Iterator[tuple[Job, Measurement]]:
        """Run ``jobs`` on up to ``slots`` workers at once; yield each with its result as
        it finishes (not necessarily in order)."""
        pending = list(jobs)
        busy: dict[int, tuple[_Worker, Job, float]] = {}  # fd -> worker, job, deadline
        selector = selectors.DefaultSelector()
        try:
            while pending or busy:
                while pending and len(busy) < self.slots:
                    job = pending.pop(0)
                    worker = self._idle.pop() if self._idle else self._start()
                    worker.send(job, self._next_seq())
                    now = time.monotonic()
                    busy[worker.fd] = (worker, job, now + self.timeout + STARTUP_SECONDS, now)
                    selector.register(worker.fd, selectors.EVENT_READ)
                soonest = min(deadline for _, _, deadline, _ in busy.values())
                events = selector.select(max(soonest - time.monotonic(), 0.0))
                ready = {key.fd for key, _ in events}
                now = time.monotonic()
                for fd in list(busy):
                    worker, job, deadline, sent = busy[fd]
                    if fd not in ready and now < deadline:
                        continue
                    result = worker.receive() if fd in ready else None
                    if result == READY:  # prepared: the candidate's own time limit starts
                        busy[fd] = (worker, job, now + self.timeout, sent)
                        continue
                    selector.unregister(fd)
                    del busy[fd]
                    if result is None:
                        result = self._failure(worker, job, fd in ready)
                    else:
                        self._idle.append(worker)
                    yield job, replace(result, wall_s=time.monotonic() - sent)
        finally:
            for worker, *_ in busy.values():
                worker.stop()
            selector.close()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _start(self) -> _Worker:
        log = open(os.path.join(self._logs.name, f"worker-{self._seq + 1}.log"), "w+b")  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "-m", "polyonnx.tune.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=self.env,
            start_new_session=True,
        )
        return _Worker(process, log)

    def _failure(self, worker: _Worker, job: Job, ended: bool) -> Measurement:
        if not ended:
            worker.stop()
            return Measurement("failed", f"timeout after {self.timeout:g} s")
        code = worker.stop()
        if code is not None and code < 0:
            reason = f"crashed: signal {signal.Signals(-code).name}"
        else:
            reason = f"worker exited with code {code}"
        last = worker.last_error()
        return Measurement("failed", f"{reason}{': ' + last if last else ''}")


class _Worker:
    def __init__(self, process: subprocess.Popen, log):
        self.process = process
        self.log = log
        self.fd = process.stdout.fileno()

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
        """The last line the worker wrote to stderr (a Python traceback's message)."""
        self.log.flush()
        self.log.seek(0)
        lines = [line.strip() for line in self.log.read().decode(errors="replace").splitlines()]
        lines = [line for line in lines if line]
        self.log.close()
        return lines[-1][:300] if lines else ""
