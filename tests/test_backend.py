"""polyonnx.backend: the onnx.backend.base.Backend surface, as onnxruntime.backend has it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.backend.base import Backend

import polyonnx.backend as backend


def _model():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_module_level_functions_exist_like_onnxruntime_backend():
    assert issubclass(backend.PolyonnxBackend, Backend)
    for name in ("prepare", "run_model", "run_node", "supports_device", "is_compatible"):
        assert callable(getattr(backend, name))
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")


def test_prepare_then_run_with_list_and_dict():
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    y = np.array([1, -1, 0.5], np.float32)
    rep = backend.prepare(_model())
    (from_list,) = rep.run([x, y])
    (from_dict,) = rep.run({"x": x, "y": y})
    np.testing.assert_array_equal(from_list, np.maximum(x + y, 0))
    np.testing.assert_array_equal(from_dict, from_list)


def test_run_model():
    x = np.ones((2, 3), np.float32)
    (out,) = backend.run_model(_model(), [x, -2 * np.ones(3, np.float32)])
    np.testing.assert_array_equal(out, np.zeros((2, 3), np.float32))


def test_run_node_infers_output_types():
    node = helper.make_node("Sub", ["a", "b"], ["c"])
    a, b = np.full((4, 5), 3.0, np.float32), np.arange(5, dtype=np.float32)
    (out,) = backend.run_node(node, [a, b])
    np.testing.assert_array_equal(out, a - b)


def test_prepare_refuses_other_devices():
    with pytest.raises(ValueError, match="CPU"):
        backend.prepare(_model(), device="CUDA")


def test_wrong_input_count_is_an_input_error():
    from polyonnx.errors import InputError

    with pytest.raises(InputError, match="2 input"):
        backend.prepare(_model()).run([np.ones((2, 3), np.float32)])
