"""The issue's judging models, end to end against onnxruntime."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyonnx
import polyonnx.backend as backend

ort = pytest.importorskip("onnxruntime")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from make_mlp import make_mlp  # noqa: E402


def _ort(model: onnx.ModelProto, feed):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)


@pytest.fixture(scope="module")
def mlp() -> onnx.ModelProto:
    return make_mlp(batch=8, sizes=(784, 512, 256, 10), seed=3)


def test_mlp_matches_onnxruntime(mlp):
    x = np.random.default_rng(0).standard_normal((8, 784)).astype(np.float32)
    (got,) = polyonnx.InferenceSession(mlp).run(None, {"input": x})
    (want,) = _ort(mlp, {"input": x})
    assert got.shape == (8, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)


def test_mlp_through_backend_prepare(mlp):
    x = np.random.default_rng(1).standard_normal((8, 784)).astype(np.float32)
    (got,) = backend.prepare(mlp).run([x])
    (want,) = _ort(mlp, {"input": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bundled_example_is_the_mlp():
    """examples/mlp.onnx is what make_mlp.py writes, and runs like it."""
    model = onnx.load(ROOT / "examples" / "mlp.onnx")
    assert [n.op_type for n in model.graph.node] == [
        "Gemm",
        "Relu",
        "Gemm",
        "Relu",
        "Gemm",
        "Softmax",
    ]
    x = np.random.default_rng(2).standard_normal((8, 784)).astype(np.float32)
    (got,) = polyonnx.InferenceSession(str(ROOT / "examples" / "mlp.onnx")).run(None, {"input": x})
    np.testing.assert_allclose(got, _ort(model, {"input": x})[0], rtol=1e-4, atol=1e-5)


def test_broadcasting_chain_matches_onnxruntime():
    shapes = {"a": [8, 1, 64], "b": [1, 32, 1], "c": [64]}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    nodes = [
        helper.make_node("Add", ["a", "b"], ["t0"]),
        helper.make_node("Mul", ["t0", "two"], ["t1"]),
        helper.make_node("Sub", ["t1", "c"], ["t2"]),
        helper.make_node("Div", ["t2", "b"], ["t3"]),
        helper.make_node("Max", ["t3", "a", "c"], ["t4"]),
        helper.make_node("Sigmoid", ["t4"], ["t5"]),
        helper.make_node("Greater", ["t5", "half"], ["mask"]),
        helper.make_node("Where", ["mask", "t5", "a"], ["y"]),
    ]
    consts = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32, 64]),
        helper.make_tensor_value_info("mask", TensorProto.BOOL, [8, 32, 64]),
    ]
    graph = helper.make_graph(nodes, "chain", inputs, outputs, consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    rng = np.random.default_rng(4)
    feed = {
        n: rng.standard_normal(s).astype(np.float32) + (3.0 if n == "b" else 0.0)
        for n, s in shapes.items()
    }
    got = polyonnx.InferenceSession(model).run(None, feed)
    want = _ort(model, feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])


def test_unsupported_ops_fail_at_load_naming_all():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("NonMaxSuppression", ["a", "a"], ["b"], name="nms"),
        helper.make_node("Unique", ["x"], ["u"], name="uniq1"),
        helper.make_node("Unique", ["a"], ["v"], name="uniq2"),
    ]
    graph = helper.make_graph(
        nodes,
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])],
        [
            helper.make_tensor_value_info("b", TensorProto.INT64, [None, 3]),
            helper.make_tensor_value_info("u", TensorProto.FLOAT, [None]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [None]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(polyonnx.UnsupportedOpError) as err:
        polyonnx.InferenceSession(model)
    assert err.value.ops == {"NonMaxSuppression": ["nms"], "Unique": ["uniq1", "uniq2"]}
    for word in ("NonMaxSuppression", "Unique", "nms", "uniq1", "uniq2"):
        assert word in str(err.value)


def test_readme_schedule_example_runs(capsys, monkeypatch):
    """The README's scheduling snippet runs as written and shows the refusal it promises."""
    import re

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Scheduling a kernel yourself\n\n```python\n(.*?)```", readme, re.S)
    assert code is not None
    monkeypatch.chdir(ROOT)
    exec(compile(code.group(1), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert (
        "parallel(k): k carries a reduction in S1 (S1[i=0, j=0, k=0] before S1[i=0, j=0, k=1])"
        in out
    )
    assert "#pragma parallel\nfor (int i_o" in out
