"""The README's MLP (batch 8, 784-512-256-10): polyonnx against onnxruntime, 1 thread."""

from __future__ import annotations

import numpy as np
import pytest
from make_mlp import make_mlp

import polyonnx

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def case():
    model = make_mlp(batch=8)
    x = np.random.default_rng(0).standard_normal((8, 784)).astype(np.float32)
    return model, {"input": x}


@pytest.mark.benchmark(group="mlp-1thread")
def test_polyonnx(benchmark, case):
    model, feed = case
    session = polyonnx.InferenceSession(model, threads=1)
    out = benchmark(session.run, None, feed)
    assert out[0].shape == (8, 10)


@pytest.mark.benchmark(group="mlp-1thread")
def test_onnxruntime(benchmark, case):
    model, feed = case
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    out = benchmark(session.run, None, feed)
    assert out[0].shape == (8, 10)
