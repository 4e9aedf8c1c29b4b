"""docs/schedule.md's final schedule of examples/mm_bias_relu.onnx (tiled, vectorised,
unrolled, fused, parallel) against the default schedule and onnxruntime, at 1 and 2
threads. The schedule is the one the page builds: its tutorial code runs here, and its
trace is replayed on a fresh program.

    python -m pytest perf/test_schedule_tutorial.py --benchmark-only \
        --benchmark-columns=median,iqr
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import numpy as np
import pytest

import polyonnx

ort = pytest.importorskip("onnxruntime")

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "mm_bias_relu.onnx"
DOC = ROOT / "docs" / "schedule.md"
THREADS = [1, 2]


def tutorial_trace() -> list[dict]:
    """Run the page's python blocks up to its reference part; the trace of its ``prog``."""
    text = DOC.read_text()
    tutorial = text[: text.index("\n# Reference\n")]
    namespace: dict = {"__name__": "schedule_doc"}
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(io.StringIO()):
        for code in re.findall(r"^```python\n(.*?)^```\n", tutorial, re.S | re.M):
            exec(compile(code, str(DOC), "exec"), namespace)
    return namespace["prog"].trace


@pytest.fixture(scope="module")
def case():
    trace = tutorial_trace()
    x = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    (want,) = polyonnx.InferenceSession(MODEL).run(None, {"x": x})
    return trace, {"x": x}, want


def _program(trace):
    prog = polyonnx.load(MODEL)
    prog.apply(trace)
    return prog


@pytest.mark.benchmark(group="tutorial")
@pytest.mark.parametrize("threads", THREADS)
def test_tutorial_schedule(benchmark, case, threads):
    trace, feed, want = case
    session = polyonnx.InferenceSession(_program(trace), threads=threads)
    (got,) = benchmark(session.run, None, feed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.benchmark(group="tutorial")
def test_tutorial_schedule_without_parallel(benchmark, case):
    """The tutorial's schedule up to Step 5: what the parallel step adds or costs."""
    trace, feed, want = case
    assert trace[-1]["primitive"] == "parallel"
    session = polyonnx.InferenceSession(_program(trace[:-1]), threads=1)
    (got,) = benchmark(session.run, None, feed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.benchmark(group="tutorial")
@pytest.mark.parametrize("threads", THREADS)
def test_default_schedule(benchmark, case, threads):
    _, feed, want = case
    session = polyonnx.InferenceSession(MODEL, threads=threads)
    (got,) = benchmark(session.run, None, feed)
    np.testing.assert_array_equal(got, want)


@pytest.mark.benchmark(group="tutorial")
@pytest.mark.parametrize("threads", THREADS)
def test_onnxruntime(benchmark, case, threads):
    _, feed, want = case
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
    (got,) = benchmark(session.run, None, feed)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
