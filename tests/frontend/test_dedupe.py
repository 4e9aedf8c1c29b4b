"""Equal constants and nodes that compute the same are merged at load (frontend/dedupe.py),
and the merged model computes what the original does."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyonnx as po
from polyonnx.frontend import load_graph
from tests.helpers import make_model

F = TensorProto.FLOAT


def _t(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def _run_both(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> None:
    """polyonnx's outputs equal onnx's reference evaluator's on the unmerged model."""
    want = ReferenceEvaluator(model).run(None, feed)
    got = po.InferenceSession(model, threads=1, tuning_db=False).run(None, feed)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _two_convs(w2: np.ndarray) -> onnx.ModelProto:
    """Two 3x3 convs on x, weights w1 and w2 (equal bytes when w2 equals w1), then Add."""
    w1 = np.full((4, 3, 3, 3), 0.25, np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="c1"),
        helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1], name="c2"),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Relu", ["b"], ["rb"]),
        helper.make_node("Add", ["ra", "rb"], ["y"]),
    ]
    return make_model(nodes, [_t("x", [1, 3, 5, 7])], [_t("y", [1, 4, 5, 7])], {"w1": w1, "w2": w2})


def test_equal_weights_make_equal_convs_and_both_chains_merge():
    model = _two_convs(np.full((4, 3, 3, 3), 0.25, np.float32))
    graph = load_graph(model)
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "Add"]
    assert graph.nodes[-1].inputs == ("ra", "ra")
    assert set(graph.constants) == {"w1"}
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 7)).astype(np.float32)
    _run_both(model, {"x": x})


def test_weights_differing_in_one_element_stay_apart():
    w2 = np.full((4, 3, 3, 3), 0.25, np.float32)
    w2[3, 2, 2, 2] = 0.5
    graph = load_graph(_two_convs(w2))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Conv", "Relu", "Relu", "Add"]


def test_attributes_graph_outputs_and_random_ops_keep_nodes_apart():
    nodes = [
        helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.0),
        helper.make_node("LeakyRelu", ["x"], ["b"], alpha=-0.0),  # -0.0 is not 0.0
        helper.make_node("LeakyRelu", ["x"], ["c"], alpha=0.0),  # a duplicate of a
        helper.make_node("Neg", ["x"], ["out1"]),
        helper.make_node("Neg", ["x"], ["out2"]),  # both are graph outputs
        helper.make_node("RandomUniformLike", ["x"], ["r1"], seed=1.0),
        helper.make_node("RandomUniformLike", ["x"], ["r2"], seed=1.0),
        helper.make_node("Sum", ["a", "b", "c", "r1", "r2"], ["y"]),
    ]
    outputs = [_t("y", [2, 3]), _t("out1", [2, 3]), _t("out2", [2, 3])]
    graph = load_graph(make_model(nodes, [_t("x", [2, 3])], outputs))
    ops = [(n.op_type, n.outputs[0]) for n in graph.nodes]
    assert ("LeakyRelu", "c") not in ops and ("LeakyRelu", "b") in ops
    assert ("Neg", "out1") in ops and ("Neg", "out2") in ops
    assert ("RandomUniformLike", "r2") in ops
    assert graph.nodes[-1].inputs == ("a", "b", "a", "r1", "r2")


def test_a_constant_graph_output_is_kept_under_its_own_name():
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("Add", ["x", "c1"], ["y"])]
    model = make_model(nodes, [_t("x", [2, 3])], [_t("y", [2, 3]), _t("c2", [2, 3])])
    model.graph.initializer.extend(
        [onnx.numpy_helper.from_array(c, "c1"), onnx.numpy_helper.from_array(c, "c2")]
    )
    graph = load_graph(model)
    assert {"c1", "c2"} <= set(graph.constants)
    x = np.ones((2, 3), np.float32)
    _run_both(model, {"x": x})
