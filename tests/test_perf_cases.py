"""Every kernel the perf/ suite times is also checked here, at its own shape: MatMuls
against numpy, the rest against onnxruntime, at 1 and 2 threads (the threaded GEMM
splits and parallel loops are different code)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import polyonnx

ort = pytest.importorskip("onnxruntime")

_PATH = pathlib.Path(__file__).resolve().parents[1] / "perf" / "test_kernels.py"
_SPEC = importlib.util.spec_from_file_location("perf_kernels", _PATH)
perf = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = perf  # its dataclasses look their module up
_SPEC.loader.exec_module(perf)


def _reference(case, model, feed):
    if case.matmul:
        return np.matmul(feed["a"].astype(np.float64), feed["b"].astype(np.float64))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)[0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", perf.CASES, ids=lambda c: c.name)
def test_perf_case_is_correct(case, threads):
    model, feed = case.build(np.random.default_rng(0))
    got = polyonnx.InferenceSession(model, threads=threads).run(None, feed)[0]
    want = _reference(case, model, feed)
    assert got.shape == want.shape and got.dtype == np.float32
    atol = 1e-4 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
