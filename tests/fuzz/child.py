"""The child side of the fuzz suite: runs one case and reports a JSON verdict.

``python -m tests.fuzz.child SEED`` runs the case of SEED in this process (under the
memory cap) and prints its verdict; ``--serve`` starts a zygote that imports polyonnx and
onnxruntime once, then reads seeds on stdin and runs each in a forked child of its own
(memory cap, timeout, killed on a hang), writing one verdict line per seed. Forking keeps
every case isolated at the cost of a fork instead of a 2 s interpreter start.

A verdict's ``outcome`` is one of PASSING (ok: matches onnxruntime; unverified: succeeded
where onnxruntime cannot check it; refused: a PolyonnxError) or a failure: crash (a
signal or an exit without a verdict), hang (timeout), memory (MemoryError, or the cap),
wrong (differs from onnxruntime), exception (not a PolyonnxError), silent (succeeded where
the case demands a refusal), harness (the generator itself failed)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

PASSING = ("ok", "unverified", "refused")
MARK = "FUZZ-VERDICT "
STAGE = "FUZZ-STAGE "
MEMORY_CAP = int(os.environ.get("POLYONNX_FUZZ_MEMORY", 3 << 30))
TIMEOUT = float(os.environ.get("POLYONNX_FUZZ_TIMEOUT", 60))
BLOWUP = MEMORY_CAP * 2 // 3
"""A case whose peak RSS passes this is a memory blow-up even if it then ends cleanly."""
KEEP_OUTPUT = 6000


def child_environment() -> None:
    """Settings every case runs under (set before polyonnx is imported)."""
    os.environ["POLYONNX_POISON_ARENA"] = "1"
    os.environ["POLYONNX_CACHE"] = "off"
    if not os.environ.get("POLYONNX_CACHE_DIR"):  # the cache is off; this is a backstop
        os.environ["POLYONNX_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyonnx-fuzz-cache-")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def stage(name: str) -> None:
    print(STAGE + name, flush=True)


# ---- running one case -------------------------------------------------------------------


def write_case(scn, root: Path):
    """The case's files under ``root``; returns what InferenceSession is given."""
    base = root / "model"
    base.mkdir(parents=True)
    for rel, data in scn.files.items():
        target = (base / rel).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for rel, points_to in scn.links.items():
        os.symlink(points_to, base / rel)
    data = scn.model
    if data is not None and b"@ABS@" in data:  # an absolute location, to a file outside base
        data = _absolute(data, root)
    path = base / "model.onnx"
    if data is not None:
        path.write_bytes(data)
    return str(path) if scn.source == "path" else data


def _absolute(data: bytes, root: Path) -> bytes:
    """The model with its external-data locations' @ABS@ replaced by ``root``."""
    import onnx

    proto = onnx.load_model_from_string(data)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            entry.value = entry.value.replace("@ABS@", str(root))
    return proto.SerializeToString()


def run_case(seed: int) -> dict:
    """Build and run the case of ``seed`` here; the verdict as a dict."""
    from . import cases

    t = cases.pick(seed)
    verdict = {"seed": seed, "family": t.family, "template": t.name}
    try:
        stage("build")
        scn = cases.scenario(seed)
    except Exception:
        return {**verdict, "outcome": "harness", "detail": traceback.format_exc()[-2000:]}
    verdict["note"] = scn.note
    with tempfile.TemporaryDirectory(prefix="polyonnx-fuzz-") as tmp:
        source = write_case(scn, Path(tmp))
        return {**verdict, **_oracle(scn, source)}


def _oracle(scn, source) -> dict:
    """Run polyonnx on the case, then onnxruntime where it succeeded; classify."""
    import polyonnx

    try:
        if scn.cli is not None:
            return _command_line(scn, source)
        stage("load")
        if scn.action is not None:
            sess = scn.action(source)
        else:
            sess = polyonnx.InferenceSession(source, threads=scn.threads)
        stage("run")
        outs = [sess.run(scn.output_names, feeds) for feeds in (scn.feeds, *scn.more_feeds)]
    except polyonnx.PolyonnxError as exc:
        return {"outcome": "refused", "detail": f"{type(exc).__name__}: {exc}"[:600]}
    except MemoryError:
        return {"outcome": "memory", "detail": traceback.format_exc()[-1500:]}
    except Exception as exc:
        return {
            "outcome": "exception",
            "detail": f"{type(exc).__name__}: {exc}"[:400],
            "traceback": traceback.format_exc()[-1500:],
        }
    stage("ort")
    verdict = _compare(scn, source, outs[0], scn.ort_feeds)
    for n, (feeds, more) in enumerate(zip(scn.more_feeds, outs[1:], strict=True), 2):
        again = _compare(scn, source, more, feeds)
        if again["outcome"] not in PASSING:
            return {**again, "detail": f"run {n} of the session: {again['detail']}"}
    return verdict


def _command_line(scn, source) -> dict:
    """``polyonnx ARGS``: exit 0 or a clean exit 2 pass (exceptions reach the oracle)."""
    from polyonnx import cli

    stage("cli")
    where = str(Path(source).parent) if isinstance(source, str) else tempfile.gettempdir()
    argv = [a.replace("{model}", str(source)).replace("{dir}", where) for a in scn.cli]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    said = err.getvalue().strip().splitlines()[-1:] or [""]
    if "Traceback" in err.getvalue():
        return {"outcome": "exception", "detail": f"exit {code} with a traceback: {said[0]}"}
    if code in (0, 2):
        return {"outcome": "refused" if code else "unverified", "detail": f"exit {code}: {said[0]}"}
    return {"outcome": "crash", "detail": f"polyonnx {' '.join(scn.cli)}: exit {code}"}


def _compare(scn, source, outs, ort_feeds) -> dict:
    """The verdict on ``outs``, polyonnx's outputs on ``ort_feeds`` (the reference's)."""
    silent = scn.expect == "refuse"
    if ort_feeds is None:
        return {"outcome": "silent" if silent else "unverified", "detail": "no onnxruntime check"}
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 4
        # the reference is the graph as written, not onnxruntime's rewrite of it
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ref_sess = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        ref = ref_sess.run(scn.output_names, ort_feeds)
    except Exception as exc:
        detail = f"onnxruntime refuses: {type(exc).__name__}: {exc}"[:600]
        return {"outcome": "silent" if silent else "unverified", "detail": detail}
    problem = mismatch(outs, ref)
    if problem:
        second = _reference_opinion(source, scn, outs, ort_feeds)
        if second is None:
            return {"outcome": "wrong", "detail": problem}
        problem = f"onnxruntime differs ({problem}); {second}"
        return {"outcome": "silent" if silent else "ok", "detail": problem}
    if silent:
        return {"outcome": "silent", "detail": "accepted (onnxruntime accepts too)"}
    return {"outcome": "ok"}


def _reference_opinion(source, scn, outs, ort_feeds) -> str | None:
    """When onnxruntime disagrees, what onnx's own reference evaluator says: a note if it
    agrees with polyonnx (onnxruntime is wrong: MaxPool SAME_UPPER with dilations), else
    None. The evaluator is Python: slow, but only asked about disagreements."""
    try:
        import onnx
        from onnx.reference import ReferenceEvaluator

        proto = onnx.load(source) if isinstance(source, str) else onnx.load_from_string(source)
        ref = ReferenceEvaluator(proto).run(scn.output_names, ort_feeds)
    except Exception:
        return None
    if mismatch(outs, ref) is None:
        return "matches onnx.reference.ReferenceEvaluator"
    return None


def mismatch(outs, ref) -> str | None:
    """Why polyonnx's outputs differ from onnxruntime's, or None. Float outputs match to
    1e-3 relative to the output's scale; where onnxruntime's value is not finite, any
    value is accepted (summation order decides inf against nan)."""
    import numpy as np

    if len(outs) != len(ref):
        return f"{len(outs)} outputs, onnxruntime gives {len(ref)}"
    for n, (got, want) in enumerate(zip(outs, ref, strict=True)):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            return f"output {n}: shape {got.shape}, onnxruntime {want.shape}"
        if got.dtype != want.dtype:
            return f"output {n}: dtype {got.dtype}, onnxruntime {want.dtype}"
        if want.dtype.kind in "fc":
            finite = np.isfinite(want)
            scale = float(np.max(np.abs(want[finite]), initial=1.0))
            close = np.isclose(got, want, rtol=1e-3, atol=1e-3 * scale) | ~finite
            if not close.all():
                at = tuple(int(v) for v in np.argwhere(~close)[0])
                return (
                    f"output {n}: {(~close).sum()} values differ, at {at}: {got[at]} vs {want[at]}"
                )
        elif not np.array_equal(got, want):
            return f"output {n}: values differ ({int((got != want).sum())} elements)"
    return None


def cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


# ---- the zygote ------------------------------------------------------------------------


def forked(seed: int, timeout: float = TIMEOUT) -> dict:
    """Run ``seed`` in a forked child under the memory cap; kill it after ``timeout``."""
    read, write = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the case's own process
        try:
            os.close(read)
            os.setpgid(0, 0)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(write, 1)
            os.dup2(write, 2)
            _in_child(seed, timeout)
        finally:
            os._exit(0)
    os.close(write)
    output, timed_out = _collect(read, start + timeout)
    if timed_out:
        _kill(pid)
    _, status, usage = os.wait4(pid, 0)
    seconds = round(time.monotonic() - start, 2)
    return verdict_of(seed, output, status, timed_out, seconds, usage.ru_maxrss)


def _in_child(seed: int, timeout: float) -> None:
    import faulthandler

    cap_memory()
    faulthandler.enable()
    # shows where a hang is and ends the child even if its parent is gone
    faulthandler.dump_traceback_later(max(timeout - 1, 1), exit=True)
    try:
        verdict = run_case(seed)
    except MemoryError:
        verdict = {"outcome": "memory", "detail": "MemoryError outside the oracle"}
    except BaseException:
        verdict = {"outcome": "harness", "detail": traceback.format_exc()[-2000:]}
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.stdout.write("\n" + MARK + json.dumps(verdict, default=str) + "\n")
    sys.stdout.flush()


def _collect(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What the child writes until it closes the pipe or the deadline passes (its first
    and last few KB if it writes more), and whether the deadline passed."""
    head = bytearray()
    tail: list[bytes] = []
    size = 0
    dropped = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return _joined(head, tail, dropped), True
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                return _joined(head, tail, dropped), False
            if len(head) < KEEP_OUTPUT:
                head += data[: KEEP_OUTPUT - len(head)]
            tail.append(data)
            size += len(data)
            while size > 4 * KEEP_OUTPUT and len(tail) > 1:
                size -= len(tail.pop(0))
                dropped = True
    finally:
        os.close(fd)


def _joined(head: bytearray, tail: list[bytes], dropped: bool) -> bytes:
    body = b"".join(tail)
    return bytes(head) + b"\n[...]\n" + body if dropped else body


def _kill(pid: int) -> None:
    """Kill the case's process group (its threads and any process it started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def verdict_of(
    seed: int, output: bytes, status: int, timed_out: bool, seconds: float, rss_kb: int
) -> dict:
    """The child's own verdict, or what its end says about it."""
    text = output.decode("utf-8", "replace")
    found = [line for line in text.splitlines() if line.startswith(MARK)]
    stages = [line[len(STAGE) :] for line in text.splitlines() if line.startswith(STAGE)]
    base = {"seed": seed, "seconds": seconds, "max_rss_mb": rss_kb // 1024}
    if found and not timed_out:
        verdict = {**base, **json.loads(found[-1][len(MARK) :])}
        if verdict["outcome"] in PASSING and rss_kb > BLOWUP >> 10:
            peak = f"peak RSS {rss_kb >> 10} MB before it ended {verdict['outcome']}"
            verdict.update(outcome="memory", detail=f"{peak}: {verdict.get('detail', '')}")
        return verdict
    from . import cases

    t = cases.pick(seed)
    base.update(family=t.family, template=t.name, stage=stages[-1] if stages else "start")
    with contextlib.suppress(Exception):  # the case's note, rebuilt here: the child is gone
        base["note"] = cases.scenario(seed).note
    tail = "\n".join(line for line in text.splitlines()[-60:] if not line.startswith(MARK))[-3000:]
    if timed_out or "Timeout (" in text:  # faulthandler's watchdog ended it
        return {
            **base,
            "outcome": "hang",
            "detail": f"no verdict after {seconds} s",
            "output": tail,
        }
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return {**base, "outcome": "crash", "detail": f"killed by {sig}", "output": tail}
    code = os.WEXITSTATUS(status)
    outcome = "memory" if "MemoryError" in text or "bad_alloc" in text else "crash"
    return {**base, "outcome": outcome, "detail": f"exit {code} without a verdict", "output": tail}


def serve() -> None:
    """The zygote: import once, then one forked child per seed read on stdin."""
    import numpy  # noqa: F401
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    import polyonnx  # noqa: F401

    from . import cases  # noqa: F401

    out = sys.stdout
    print("READY", file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        seed = int(line)
        try:
            verdict = forked(seed)
        except Exception:
            verdict = {"seed": seed, "outcome": "harness", "detail": traceback.format_exc()[-2000:]}
        out.write(json.dumps(verdict, default=str) + "\n")
        out.flush()


def main(argv: list[str]) -> int:
    child_environment()
    if argv[:1] == ["--serve"]:
        serve()
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    fork = "--fork" in argv
    seeds = [int(a) for a in argv if not a.startswith("--")]
    failed = 0
    for seed in seeds:
        if fork:
            verdict = forked(seed)
        else:
            cap_memory()
            verdict = run_case(seed)
        failed += verdict["outcome"] not in PASSING
        print(json.dumps(verdict, default=str, indent=1), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
