"""A measurement worker: ``python -m polyonnx.tune.worker``, one JSON job per stdin line,
one JSON result per stdout line, after a ``{"seq": 7, "ready": true}`` line that says the
model is lowered and the default's reference outputs are computed (the candidate's time
limit starts there). tune/measure.py runs a few of these and survives their
crashes and hangs; nothing else should start one.

A job: ``{"seq": 7, "model": PATH, "shapes": {...}, "kernel": NAME, "trace": [...],
"threads": 2, "min_seconds": 0.05}``; its result: ``{"seq": 7, "status": "ok",
"reason": null, "median_s": ..., "spread_s": ..., "repeats": ..., "compile_s": ...}``.

``POLYONNX_TUNE_FAULT=segv:3,hang:5`` makes the jobs with those sequence numbers crash
(SIGSEGV) or hang: how the tests prove that a bad candidate cannot take a session down.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import sys
import time

from polyonnx.runtime.compiled import lower_model
from polyonnx.target import host_target
from polyonnx.tune.runner import Bench, scrub_size

FAULT = "POLYONNX_TUNE_FAULT"


def main() -> int:
    _die_with_parent()
    results = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the result stream
    faults = _faults(os.environ.get(FAULT, ""))
    programs: dict[str, object] = {}
    benches: dict[tuple, Bench] = {}
    for line in sys.stdin:
        job = json.loads(line)
        key = json.dumps([job["model"], job.get("shapes")], sort_keys=True)
        if key not in programs:
            programs[key] = lower_model(job["model"], job.get("shapes") or None)
        bench_key = (key, job["kernel"], job["threads"])
        if bench_key not in benches:
            program = programs[key]
            scrub = scrub_size(program, job["kernel"], host_target().l3_bytes)
            benches[bench_key] = Bench(program, job["kernel"], job["threads"], scrub)
        bench = benches[bench_key]
        bench.reference()
        _send(results, {"seq": job["seq"], "ready": True})  # the candidate's time starts now
        _inject(faults.get(job["seq"]))
        measurement = bench.measure(job["trace"], job.get("min_seconds", 0.05))
        _send(results, {"seq": job["seq"], **dataclasses.asdict(measurement)})
    return 0


def _send(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _die_with_parent() -> None:
    """Be killed when the tuner dies (Linux's PR_SET_PDEATHSIG), so that a hung candidate
    does not outlive a killed session; if the tuner is gone already, leave now."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(0)


PR_SET_PDEATHSIG = 1


def _faults(spec: str) -> dict[int, str]:
    faults = {}
    for item in filter(None, spec.split(",")):
        kind, _, seq = item.partition(":")
        faults[int(seq)] = kind
    return faults


def _inject(kind: str | None) -> None:
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "hang":
        while True:
            time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
