"""The parent side of the fuzz suite: a zygote process (child.py --serve) that runs cases
in forked children, and the corpus of seeds the tests run."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

from .cases import ci_cases
from .child import PASSING, TIMEOUT
from .models import ROOT


def corpus() -> list[int]:
    """The seeds to run: POLYONNX_FUZZ_CASES=N (from POLYONNX_FUZZ_START, default 0), or
    POLYONNX_FUZZ_SEEDS=3,17,40, or the CI corpus (the first variants of every template)."""
    if os.environ.get("POLYONNX_FUZZ_SEEDS"):
        return [int(s) for s in os.environ["POLYONNX_FUZZ_SEEDS"].split(",") if s.strip()]
    count = int(os.environ.get("POLYONNX_FUZZ_CASES", ci_cases()))
    start = int(os.environ.get("POLYONNX_FUZZ_START", 0))
    return list(range(start, start + count))


class Zygote:
    """One zygote process; ``run(seed)`` returns the verdict of the seed's case."""

    def __init__(self, timeout: float = TIMEOUT):
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.cache = tempfile.mkdtemp(prefix="polyonnx-fuzz-cache-")

    def _start(self) -> subprocess.Popen:
        os.makedirs(self.cache, exist_ok=True)
        env = dict(os.environ)
        env.update(
            POLYONNX_POISON_ARENA="1",
            POLYONNX_CACHE="off",
            POLYONNX_CACHE_DIR=self.cache,
            POLYONNX_FUZZ_TIMEOUT=str(self.timeout),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.child", "--serve"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        line = self._readline(proc, 120)
        if line.strip() != "READY":
            proc.kill()
            raise RuntimeError(f"the fuzz zygote did not start: {line!r}")
        return proc

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout: float) -> str:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        return proc.stdout.readline() if ready else ""

    def run(self, seed: int) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        start = time.monotonic()
        self.proc.stdin.write(f"{seed}\n")
        self.proc.stdin.flush()
        line = self._readline(self.proc, self.timeout + 60)
        if not line:
            self.close()
            return {
                "seed": seed,
                "outcome": "harness",
                "detail": "the zygote gave no verdict",
                "seconds": round(time.monotonic() - start, 2),
            }
        return json.loads(line)

    def close(self) -> None:
        """Stop the zygote (a case still running ends at its own timeout)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        shutil.rmtree(self.cache, ignore_errors=True)


def passed(verdict: dict) -> bool:
    return verdict.get("outcome") in PASSING


def describe(verdict: dict) -> str:
    """A failing verdict, for a test's assertion message or the runner's report."""
    head = (
        f"seed {verdict.get('seed')} [{verdict.get('family')}/{verdict.get('template')}] "
        f"{verdict.get('outcome').upper()}: {verdict.get('detail', '')}"
    )
    lines = [head]
    if verdict.get("note"):
        lines.append(f"  case: {verdict['note']}")
    if verdict.get("stage"):
        lines.append(f"  last stage: {verdict['stage']}")
    for key in ("traceback", "output"):
        if verdict.get(key):
            lines.append(f"  {key}:\n{verdict[key]}")
    lines.append(f"  reproduce: python -m tests.fuzz.run --seed {verdict.get('seed')}")
    return "\n".join(lines)
