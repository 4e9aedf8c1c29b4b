"""Attribute validation at load (polyonnx/frontend/validate.py) and the other clean
refusals of malformed models: one negative test per check, each asserting a ModelError
that names the node and the attribute; a hypothesis test that legal values still load."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from polyonnx.errors import ModelError
from polyonnx.frontend import load_graph

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "validate", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.array(value, dtype), name)


def one_node(op, shape, out_rank=None, inputs=(), inits=(), opset=17, extra_inputs=(), **attrs):
    """Node 'bad' of ``op`` on x of ``shape`` (plus ``inputs`` names), output y."""
    node = helper.make_node(op, ["x", *inputs], ["y"], name="bad", **attrs)
    rank = len(shape) if out_rank is None else out_rank
    return make_model(
        [node],
        [tensor("x", shape), *extra_inputs],
        [tensor("y", [f"d{i}" for i in range(rank)])],
        inits,
        opset,
    )


def conv(shape=(1, 4, 5, 5), weight=(2, 4, 3, 3), op="Conv", **attrs):
    w = const("w", np.ones(weight), np.float32)
    return one_node(op, list(shape), inputs=["w"], inits=[w], **attrs)


def pool(op="MaxPool", **attrs):
    return one_node(op, [1, 2, 6, 6], **{"kernel_shape": [2, 2], **attrs})


def pad(mode, pads, shape=(1, 3)):
    return one_node("Pad", list(shape), inputs=["p"], inits=[const("p", pads)], mode=mode)


def concat(*shapes, axis=0):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Concat", names, ["y"], name="bad", axis=axis)
    inputs = [tensor(n, list(s)) for n, s in zip(names, shapes, strict=True)]
    return make_model([node], inputs, [tensor("y", ["n"])])


def reduce_axes_input(axes, **attrs):
    return one_node("ReduceSum", [2, 3], inputs=["a"], inits=[const("a", axes)], **attrs)


def constant(**attrs):
    node = helper.make_node("Constant", [], ["c"], name="bad", **attrs)
    add = helper.make_node("Add", ["x", "c"], ["y"])
    return make_model([node, add], [tensor("x", [2])], [tensor("y", [2])])


def split(sizes, outputs=2):
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node("Split", ["x", "s"], names, name="bad", axis=1)
    outs = [tensor(n, ["a", "b"]) for n in names]
    return make_model([node], [tensor("x", [2, 6])], outs, [const("s", sizes)])


def topk(k):
    node = helper.make_node("TopK", ["x", "k"], ["y", "i"], name="bad")
    outputs = [tensor("y", ["a", "b"]), tensor("i", ["a", "b"], I64)]
    return make_model([node], [tensor("x", [2, 3])], outputs, [const("k", [k])])


MODELS = {
    "transpose-perm-out-of-rank": (one_node("Transpose", [2, 3], perm=[0, 5]), "'perm'"),
    "transpose-perm-repeats": (one_node("Transpose", [2, 3], perm=[1, 1]), "'perm'"),
    "transpose-perm-short": (one_node("Transpose", [2, 3, 4], perm=[1, 0]), "'perm'"),
    "gather-axis": (
        one_node("Gather", [2, 3], inputs=["i"], inits=[const("i", [0])], axis=-5),
        "'axis'",
    ),
    "gather-constant-index": (
        one_node("Gather", [2, 3], inputs=["i"], inits=[const("i", [3])], axis=1),
        "indices",
    ),
    "gather-elements-axis": (
        one_node(
            "GatherElements",
            [2, 3],
            inputs=["i"],
            extra_inputs=[tensor("i", [2, 3], I64)],
            axis=2,
        ),
        "'axis'",
    ),
    "softmax-axis": (one_node("Softmax", [2, 3], axis=2), "'axis'"),
    "argmax-axis": (one_node("ArgMax", [2, 3], axis=-3), "'axis'"),
    "flatten-axis": (one_node("Flatten", [2, 3], out_rank=2, axis=3), "'axis'"),
    "conv-negative-pads": (conv(pads=[-1, 0, 0, 0]), "'pads'"),
    "conv-pads-length": (conv(pads=[1, 1]), "'pads'"),
    "conv-zero-stride": (conv(strides=[0, 1]), "'strides'"),
    "conv-zero-dilation": (conv(dilations=[1, 0]), "'dilations'"),
    "conv-kernel-shape": (conv(kernel_shape=[2, 2]), "'kernel_shape'"),
    "conv-group-channels": (conv(group=3, weight=(3, 1, 3, 3)), "group"),
    "conv-group-zero": (conv(group=0), "'group'"),
    "conv-weight-channels": (conv(weight=(2, 3, 3, 3)), "channels"),
    "conv-auto-pad": (conv(auto_pad="SOMETIMES"), "'auto_pad'"),
    "conv-transpose-output-padding": (
        conv(op="ConvTranspose", weight=(4, 2, 3, 3), strides=[2, 2], output_padding=[2, 0]),
        "'output_padding'",
    ),
    "conv-transpose-output-padding-no-stride": (
        conv(op="ConvTranspose", weight=(4, 2, 3, 3), output_padding=[1, 1]),
        "'output_padding'",
    ),
    "maxpool-zero-stride": (pool(strides=[0, 1]), "'strides'"),
    "maxpool-kernel-zero": (pool(kernel_shape=[0, 2]), "'kernel_shape'"),
    "maxpool-ceil-mode": (pool(ceil_mode=2), "'ceil_mode'"),
    "averagepool-negative-pads": (pool("AveragePool", pads=[0, -1, 0, 0]), "'pads'"),
    "pad-reflect-wider-than-dim": (pad("reflect", [0, 3, 0, 3]), "reflect"),
    "pad-crops-past-dim": (pad("constant", [0, -4, 0, 0]), "crop"),
    "pad-mode": (pad("mirror", [0, 1, 0, 1]), "'mode'"),
    "pad-count": (pad("constant", [0, 1]), "pads"),
    "reducesum-keepdims": (reduce_axes_input([1], keepdims=5), "'keepdims'"),
    "reducesum-axes-input": (reduce_axes_input([2]), "axes"),
    "reducesum-axes-repeat": (reduce_axes_input([1, -1]), "repeats"),
    "reducemean-axes-attribute": (one_node("ReduceMean", [2, 3], axes=[-3]), "'axes'"),
    "reducemax-noop-flag": (
        one_node("ReduceMax", [2, 3], opset=18, noop_with_empty_axes=3),
        "'noop_with_empty_axes'",
    ),
    "argmin-select-last-index": (one_node("ArgMin", [2, 3], select_last_index=7), "index"),
    "gemm-trans-a": (
        one_node("Gemm", [2, 2], inputs=["b"], inits=[const("b", np.eye(2), np.float32)], transA=2),
        "'transA'",
    ),
    "concat-scalars": (concat([], []), "scalar"),
    "concat-ranks": (concat([2], [2, 1]), "ranks"),
    "concat-dims": (concat([2, 3], [2, 4], axis=0), "dim 1"),
    "concat-axis": (concat([2, 3], [2, 3], axis=2), "'axis'"),
    "constant-no-value": (constant(), "exactly one value"),
    "constant-two-values": (
        constant(value_float=1.0, value_floats=[1.0, 2.0]),
        "exactly one value",
    ),
    "split-sum": (split([2, 3]), "sums"),
    "split-negative": (split([7, -1]), "negative"),
    "squeeze-non-unit": (
        one_node("Squeeze", [2, 3], out_rank=1, inputs=["a"], inits=[const("a", [0])]),
        "size 2",
    ),
    "unsqueeze-axis": (
        one_node("Unsqueeze", [2, 3], out_rank=3, inputs=["a"], inits=[const("a", [4])]),
        "axes",
    ),
    "reshape-two-minus-one": (
        one_node("Reshape", [2, 3], inputs=["s"], inits=[const("s", [-1, -1])]),
        "-1",
    ),
    "tile-negative": (
        one_node("Tile", [2, 3], inputs=["r"], inits=[const("r", [1, -2])]),
        "repeats",
    ),
    "expand-not-broadcast": (
        one_node("Expand", [2, 3], inputs=["s"], inits=[const("s", [4, 3])]),
        "broadcast",
    ),
    "slice-zero-step": (
        one_node(
            "Slice",
            [2, 3],
            inputs=["b", "e", "a", "st"],
            inits=[const("b", [0]), const("e", [2]), const("a", [1]), const("st", [0])],
        ),
        "steps",
    ),
    "depth-to-space-blocksize": (
        one_node("DepthToSpace", [1, 4, 2, 2], blocksize=0),
        "'blocksize'",
    ),
    "depth-to-space-channels": (
        one_node("DepthToSpace", [1, 6, 2, 2], blocksize=2),
        "channels",
    ),
    "resize-mode": (
        one_node(
            "Resize",
            [1, 1, 2, 2],
            inputs=["", "sc"],
            inits=[const("sc", [1, 1, 2, 2], np.float32)],
            mode="bicubic",
        ),
        "'mode'",
    ),
    "resize-negative-scale": (
        one_node(
            "Resize",
            [1, 1, 2, 2],
            inputs=["", "sc"],
            inits=[const("sc", [1, 1, -2, 2], np.float32)],
        ),
        "scales",
    ),
    "topk-k": (topk(4), "k = 4"),
    "lrn-size": (one_node("LRN", [1, 2, 3, 3], size=0), "'size'"),
    "cumsum-axis": (
        one_node("CumSum", [2, 3], inputs=["a"], inits=[const("a", 2)]),
        "axis",
    ),
    "reverse-sequence-axes": (
        one_node(
            "ReverseSequence",
            [2, 3],
            inputs=["l"],
            inits=[const("l", [1, 1, 1])],
            batch_axis=1,
            time_axis=1,
        ),
        "batch_axis",
    ),
}


@pytest.mark.parametrize(("model", "why"), MODELS.values(), ids=MODELS.keys())
def test_invalid_attribute_is_a_model_error_naming_node_and_attribute(model, why):
    with pytest.raises(ModelError) as info:
        load_graph(model)
    message = str(info.value)
    assert "'bad'" in message and why in message, message
    assert "malformed" in message, message


def test_every_problem_of_the_model_in_one_error():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="first", perm=[0, 5]),
        helper.make_node("ReduceSum", ["t"], ["y"], name="second", keepdims=5),
    ]
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", ["a", "b"])])
    with pytest.raises(ModelError, match=r"(?s)2 malformed.*'first'.*'perm'.*'second'.*keepdims"):
        load_graph(model)


def test_graph_name_with_invalid_utf8():
    model = one_node("Relu", [2])
    model.graph.name = "GRAPHNAME"
    data = model.SerializeToString().replace(b"GRAPHNAME", b"GRAPH\xff\xfeME")
    with pytest.raises(ModelError, match=r"graph\.name is not valid UTF-8"):
        load_graph(data)


def test_node_name_with_invalid_utf8():
    model = one_node("Relu", [2])
    data = model.SerializeToString().replace(b"bad", b"b\xffd")
    with pytest.raises(ModelError, match=r"node\[0\].name is not valid UTF-8"):
        load_graph(data)


def test_unknown_data_type_names_the_tensor():
    node = helper.make_node("Identity", ["x"], ["y"], name="copy")
    model = make_model([node], [tensor("x", [2], 99)], [tensor("y", [2], 99)])
    with pytest.raises(ModelError, match="'x' has data_type 99"):
        load_graph(model)


def test_unknown_data_type_of_an_initializer_names_it():
    w = onnx.TensorProto(name="w", data_type=99, dims=[2], raw_data=b"\0" * 8)
    node = helper.make_node("Identity", ["w"], ["y"])
    with pytest.raises(ModelError, match="'w' has data_type 99"):
        load_graph(make_model([node], [], [tensor("y", [2])], [w]))


def test_string_tensor_reaching_a_node_is_refused_naming_it():
    node = helper.make_node("Identity", ["x"], ["y"], name="copy")
    strings = TensorProto.STRING
    model = make_model([node], [tensor("x", [2], strings)], [tensor("y", [2], strings)])
    with pytest.raises(ModelError, match=r"string tensors.*\n.*'x'.*Identity node 'copy'"):
        load_graph(model)


def test_string_constant_returned_as_output_still_loads():
    nodes = [
        helper.make_node("Constant", [], ["s"], value_string="hello"),
        helper.make_node("Relu", ["x"], ["y"]),
    ]
    outputs = [tensor("y", [2]), tensor("s", [], TensorProto.STRING)]
    graph = load_graph(make_model(nodes, [tensor("x", [2])], outputs))
    assert graph.constants["s"] == "hello"


# ---- legal values still load -----------------------------------------------------------------


@st.composite
def legal_models(draw) -> onnx.ModelProto:
    """One node of a drawn op with drawn legal attributes on a drawn shape."""
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    axis = draw(st.integers(-rank, rank - 1))
    flag = draw(st.integers(0, 1))
    op = draw(st.sampled_from(["Transpose", "Gather", "Softmax", "Concat", "ReduceSum", "Pad"]))
    if op == "Transpose":
        return one_node(op, shape, perm=draw(st.permutations(range(rank))))
    if op == "Gather":
        index = draw(st.integers(-shape[axis], shape[axis] - 1))
        return one_node(op, shape, inputs=["i"], inits=[const("i", [index])], axis=axis)
    if op == "Softmax":
        return one_node(op, shape, axis=axis)
    if op == "Concat":
        return concat(shape, shape, axis=axis)
    if op == "ReduceSum":
        axes = draw(st.lists(st.integers(-rank, rank - 1), unique_by=lambda a: a % rank))
        return reduce_axes_input_of(shape, axes, keepdims=flag)
    mode = draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    most = [d - 1 if mode == "reflect" else 3 for d in shape]
    pads = [draw(st.integers(0, m)) for m in most + most]
    return pad(mode, pads, shape)


def reduce_axes_input_of(shape, axes, **attrs):
    inits = [const("a", axes)] if axes else []
    return one_node("ReduceSum", shape, inputs=["a"] if axes else [], inits=inits, **attrs)


@st.composite
def legal_convs(draw) -> onnx.ModelProto:
    spatial = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2]))
    kernel = draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    strides = draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    dilations = draw(st.lists(st.integers(1, 2), min_size=spatial, max_size=spatial))
    pads = draw(st.lists(st.integers(0, 2), min_size=2 * spatial, max_size=2 * spatial))
    x = [1, 2 * group] + [8] * spatial
    if draw(st.booleans()):
        limit = [max(s, d) - 1 for s, d in zip(strides, dilations, strict=True)]
        padding = [draw(st.integers(0, m)) for m in limit]
        weight = (2 * group, 2, *kernel)
        attrs = {"output_padding": padding, "op": "ConvTranspose"}
    else:
        weight, attrs = (2 * group, 2, *kernel), {}
    return conv(x, weight, strides=strides, dilations=dilations, pads=pads, group=group, **attrs)


def assert_loads_unchanged(model: onnx.ModelProto) -> None:
    """The model loads, and its node keeps its op and the attributes it was given."""
    (node,) = load_graph(model).nodes
    (given,) = model.graph.node
    assert node.op_type == given.op_type
    for attr in given.attribute:
        value = helper.get_attribute_value(attr)
        value = value.decode() if isinstance(value, bytes) else value
        assert list(np.atleast_1d(node.attrs[attr.name])) == list(np.atleast_1d(value))


@settings(max_examples=40, deadline=None)
@given(legal_models())
def test_legal_attributes_still_load(model):
    assert_loads_unchanged(model)


@settings(max_examples=30, deadline=None)
@given(legal_convs())
def test_legal_conv_attributes_still_load(model):
    assert_loads_unchanged(model)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_axis_may_be_the_rank_before_opset_13_only(op):
    """Before opset 13 the input is coerced to 2D at ``axis``, which may be the rank."""
    load_graph(one_node(op, (2, 3), opset=11, axis=2))
    load_graph(one_node(op, (2, 3), opset=11, axis=-2))
    for opset, axis in ((11, 3), (11, -3), (13, 2), (13, -3)):
        with pytest.raises(ModelError, match=rf"{op} node 'bad': attribute 'axis' {axis} is out"):
            load_graph(one_node(op, (2, 3), opset=opset, axis=axis))


def test_an_unknown_dim_from_shape_inference_is_not_a_negative_dim():
    """onnx infers -1 for a Split's shorter last part (5 outputs of 4); it is not refused."""
    node = helper.make_node("Split", ["x"], [f"y{i}" for i in range(5)], axis=1, num_outputs=5)
    model = make_model(
        [node], [tensor("x", [2, 4])], [tensor(f"y{i}", [2, f"w{i}"]) for i in range(5)], opset=18
    )
    graph = load_graph(model)
    assert [tuple(v.shape) for v in graph.outputs][-1] == (2, 0)
