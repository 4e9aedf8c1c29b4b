"""Sessions specialise on what lowering must know: symbolic dims, and the values of small
inputs that decide shapes or axes (compiled once per distinct value, then cached)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import polyonnx
from polyonnx.errors import InputError
from polyonnx.frontend import load_graph


def _model(nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _reduce_with_axes_input():
    return _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5]),
            helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
    )


def test_axes_given_as_an_input_are_specialised_per_value():
    sess = polyonnx.InferenceSession(_reduce_with_axes_input())
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    for axis in (0, 2, -2, 0):
        (y,) = sess.run(None, {"x": x, "axes": np.array([axis], np.int64)})
        np.testing.assert_allclose(y, x.sum(axis=axis), rtol=1e-5, atol=1e-6)
    assert len(sess._compiled) == 3  # axis 0 was compiled once and reused


def test_reshape_target_shape_as_an_input():
    model = _model(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Relu", ["r"], ["y"]),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
    )
    sess = polyonnx.InferenceSession(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 6
    for target in ([3, 4], [-1, 2]):
        (y,) = sess.run(None, {"x": x, "shape": np.array(target, np.int64)})
        np.testing.assert_array_equal(y, np.maximum(x.reshape(target), 0))


def test_value_inputs_are_still_validated():
    sess = polyonnx.InferenceSession(_reduce_with_axes_input())
    x = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(InputError, match=r"'axes'.*int64.*int32"):
        sess.run(None, {"x": x, "axes": np.array([0], np.int32)})


def test_load_graph_turns_input_values_into_constants():
    graph = load_graph(_reduce_with_axes_input(), input_values={"axes": np.array([1], np.int64)})
    assert [v.name for v in graph.inputs] == ["x"]
    assert graph.constants["axes"].tolist() == [1]
    assert graph.value("y").shape == (3, 5)


def test_load_graph_refuses_values_for_unknown_inputs():
    with pytest.raises(InputError, match="nope"):
        load_graph(_reduce_with_axes_input(), input_values={"nope": np.array([1])})


def test_symbolic_batch_compiles_once():
    model = _model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7])],
        opset=17,
    )
    sess = polyonnx.InferenceSession(model)
    assert sess.get_inputs()[0].shape == ["N", 7]
    for n in (1, 5, 1):
        x = np.random.default_rng(n).standard_normal((n, 7)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        e = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert sess.compile_count == 1  # one sample's code, run in blocks (runtime/blocks.py)


def test_outputs_that_fold_to_constants_keep_their_shape():
    model = _model(
        [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["x"], ["size"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("size", TensorProto.INT64, []),
        ],
    )
    shape, size = polyonnx.InferenceSession(model).run(None, {"x": np.zeros((3, 4), np.float32)})
    assert shape.tolist() == [3, 4]
    assert size.shape == () and int(size) == 12


def test_string_inputs_are_refused_with_a_clear_error():
    model = _model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [2])],
    )
    with pytest.raises(polyonnx.ModelError, match=r"(?s)string tensors.*'s' \(graph input"):
        polyonnx.InferenceSession(model)


def _dropout(ratio: float):
    return _model(
        [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"])],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("training", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 3]),
        ],
    )


def test_training_mode_dropout_is_refused_not_run_as_inference():
    model = _dropout(0.5)
    model.graph.initializer.append(helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.5]))
    sess = polyonnx.InferenceSession(model)
    x = np.ones((2, 3), np.float32)
    y, mask = sess.run(None, {"x": x, "training": np.array(False)})
    np.testing.assert_array_equal(y, x)
    assert mask.all()
    with pytest.raises(polyonnx.LoweringError, match="training mode"):
        sess.run(None, {"x": x, "training": np.array(True)})


def _softmax_rows():
    return _model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7])],
        opset=17,
    )


def test_specialize_compiles_chosen_sizes_in_the_background():
    from polyonnx.runtime.blocks import Blocked

    sess = polyonnx.InferenceSession(_softmax_rows(), cache=False, specialize={"N": [4]})
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    first = sess.run(None, {"x": x})[0]  # runs in blocks while the size-4 code compiles
    assert isinstance(sess.runner_for({"x": x}), Blocked) or sess.compile_count == 2
    assert sess.wait_for_specializations(120)
    assert not isinstance(sess.runner_for({"x": x}), Blocked)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], first, rtol=1e-6, atol=1e-7)
    sess.run(None, {"x": x[:3]})  # a size not chosen: blocks
    assert isinstance(sess.runner_for({"x": x[:3]}), Blocked)
    assert sess.compile_count == 2


@pytest.mark.parametrize(
    "bad", [["N", 4], {"N": 4}, {"N": [0]}, {"N": [True]}, {"N": "4"}, {3: [1]}]
)
def test_specialize_is_checked(bad):
    from polyonnx.errors import ArgumentError

    with pytest.raises(ArgumentError, match="specialize"):
        polyonnx.InferenceSession(_softmax_rows(), specialize=bad)
