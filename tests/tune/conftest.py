"""A small model for the tuner's tests: MatMul + bias + Relu (a GEMM task with a fused
epilogue), twice with the same shapes (one task, two kernels), joined by a Concat,
then Softmax (tasks that are not GEMMs)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper


def small_model(rows: int = 24, depth: int = 40, cols: int = 48) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def const(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    inits = [
        const("w1", (depth, cols)), const("b1", (cols,)),
        const("w2", (depth, cols)), const("b2", (cols,)),
    ]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["y", "w2"], ["m2"], name="mm2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], name="add2"),
        helper.make_node("Relu", ["a2"], ["r2"], name="relu2"),
        helper.make_node("Concat", ["r1", "r2"], ["s"], name="concat", axis=1),
        helper.make_node("Softmax", ["s"], ["out"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [rows, depth]),
            helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [rows, depth]),
        ],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [rows, 2 * cols])],
        inits,
    )
    return helper.make_model(
        graph, ir_version=10, opset_imports=[helper.make_operatorsetid("", 17)]
    )


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "small.onnx"
    onnx.save(small_model(), path)
    return str(path)


@pytest.fixture
def make_model():
    """``make_model(rows=..., depth=..., cols=...)``: the small model with other shapes."""
    return small_model


def _tuned_kernels(session) -> tuple[str, ...]:
    feed = {i.name: np.ones(i.shape, np.float32) for i in session.get_inputs()}
    return session.compiled_for(feed).tuned


@pytest.fixture
def tuned_kernels():
    """``tuned_kernels(session)``: the kernels ``session`` runs with tuning records
    (compiled for the small model's inputs, as a run would)."""
    return _tuned_kernels
