"""Conv's table of algorithms (CONV_ALGORITHMS in polyonnx/krnl/ops/conv.py): tried in
order, the first that fits lowers the node."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyonnx as po
from polyonnx.krnl.ops import conv


def _conv_model(c: int, m: int, size: int, k: int, group: int = 1, **attrs):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((m, c // group, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group, **attrs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])
    pad, stride = attrs.get("pads", [0])[0], attrs.get("strides", [1])[0]
    out = (size + 2 * pad - k) // stride + 1
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, out, out])
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_the_table_ends_with_the_direct_reduction_which_always_fits():
    names = [a.name for a in conv.CONV_ALGORITHMS]
    assert len(set(names)) == len(names)
    assert names[-1] == "direct" and conv.CONV_ALGORITHMS[-1].fits(None) is True


@pytest.mark.parametrize(
    ("model", "want"),
    [
        (_conv_model(64, 64, 56, 3, pads=[1, 1, 1, 1]), "winograd"),
        (_conv_model(64, 128, 28, 1, strides=[2, 2]), "subsampled_1x1"),
        (_conv_model(32, 32, 28, 3, group=32, pads=[1, 1, 1, 1]), "flat_depthwise"),
        (_conv_model(32, 32, 112, 3, group=32, pads=[1, 1, 1, 1]), "padded_depthwise"),
        (_conv_model(2, 3, 7, 3, pads=[1, 1, 1, 1]), "direct"),
    ],
)
def test_a_conv_takes_the_first_algorithm_that_fits(model, want, monkeypatch):
    chosen: list[str] = []

    def recording(algorithm: conv.ConvAlgorithm) -> conv.ConvAlgorithm:
        def lower(case: conv.ConvCase, fit: object) -> None:
            chosen.append(algorithm.name)
            algorithm.lower(case, fit)

        return dataclasses.replace(algorithm, lower=lower)

    monkeypatch.setattr(conv, "CONV_ALGORITHMS", tuple(map(recording, conv.CONV_ALGORITHMS)))
    po.load(model)
    assert chosen == [want]
