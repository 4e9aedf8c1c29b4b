"""A symbolic batch compiled once (run in blocks, runtime/blocks.py) against the session
specialised to the batch and against onnxruntime, at batch 4, 1 and 2 threads; and a
symbolic sequence compiled once (isl parameters, runtime/parametric.py) against code
specialised to the length and onnxruntime, at length 64.

    python -m pytest perf/test_symbolic.py --benchmark-only --benchmark-columns=median,iqr

perf/symbolic_batch.py and perf/symbolic_sequence.py print the whole tables (batch 1 to
16, lengths 1 to 384, first-call costs).
"""

from __future__ import annotations

import numpy as np
import pytest
from symbolic_batch import feed_for, pinned, symbolic_model
from symbolic_sequence import DEFAULT
from symbolic_sequence import feed_for as sequence_feed

import polyonnx
from polyonnx.runtime.compiled import compile_graph
from polyonnx.runtime.parametric import ParametricModel
from polyonnx.runtime.session import InferenceSession

pytest.importorskip("onnxruntime")

MODELS = ["resnet50", "squeezenet", "torch_encoder"]
BATCH = 4


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return request.param, symbolic_model(request.param)


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"{t}t")
def test_symbolic_batch(benchmark, ort_session, paired, model, threads):
    name, proto = model
    feed = feed_for(proto, BATCH)
    blocked = polyonnx.InferenceSession(proto, threads=threads, cache=False)
    fixed = polyonnx.InferenceSession(pinned(proto, BATCH), threads=threads, cache=False)
    got, want = blocked.run(None, feed), fixed.run(None, feed)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert blocked.compile_count == 1
    benchmark.group = f"symbolic-{name}-b{BATCH}-{threads}t"
    benchmark.extra_info.update(case=f"symbolic-{name}", impl="polyonnx", threads=threads)
    benchmark(blocked.run, None, feed)
    baseline = ort_session(proto, threads)
    paired(
        benchmark,
        lambda: blocked.run(None, feed),
        {
            "specialised": lambda: fixed.run(None, feed),
            "onnxruntime": lambda: baseline.run(None, feed),
        },
        threads,
    )


LENGTH = 64


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"{t}t")
def test_symbolic_sequence(benchmark, ort_session, paired, threads):
    proto = onnx_model(DEFAULT)
    session = InferenceSession(proto, threads=threads, cache=False)
    feed = sequence_feed(session, LENGTH)
    got = session.run(None, feed)
    assert isinstance(session._parametric, ParametricModel), session.not_parametric
    fixed = compile_graph(session._specialised(feed))
    fixed.set_threads(threads)
    want = fixed.run(feed)
    for a, b in zip(got, want.values(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    benchmark.group = f"symbolic-seqencoder-s{LENGTH}-{threads}t"
    benchmark.extra_info.update(case="symbolic-seqencoder", impl="polyonnx", threads=threads)
    benchmark(session.run, None, feed)
    baseline = ort_session(proto, threads)
    paired(
        benchmark,
        lambda: session.run(None, feed),
        {
            "specialised": lambda: fixed.run(feed),
            "onnxruntime": lambda: baseline.run(None, feed),
        },
        threads,
    )


def onnx_model(path):
    import onnx

    return onnx.load(str(path))
