"""Tests for the frontend: loading, checking, shape inference, folding, Graph building."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyonnx.errors import InputError, ModelError, UnsupportedOpError
from polyonnx.frontend import Graph, load_graph, load_model
from polyonnx.frontend.fold import MAX_FILL_ELEMENTS, MAX_FOLD_ELEMENTS

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: tuple[np.ndarray | onnx.TensorProto, ...] | dict[str, np.ndarray] = (),
    opset: int = 17,
    **kwargs,
) -> onnx.ModelProto:
    """A checked-shape test model: IR 10, default-domain opset ``opset``."""
    if isinstance(initializers, dict):
        initializers = [numpy_helper.from_array(v, k) for k, v in initializers.items()]
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset), *kwargs.pop("extra_opsets", [])]
    return helper.make_model(graph, ir_version=10, opset_imports=imports, **kwargs)


def tensor(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def mlp_model() -> onnx.ModelProto:
    """x[2,4] @ w[4,3] + b → Relu, with named nodes and float weights."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
        helper.make_node("Add", ["xw", "b"], ["h"], name="add"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    return make_model(nodes, [tensor("x", [2, 4])], [tensor("y", [2, 3])], weights)


def shape_chain_model(x_shape) -> onnx.ModelProto:
    """The pattern PyTorch exports for ``x.reshape(x.shape[0], -1)``, then a Relu."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    consts = {
        "zero": np.array(0, np.int64),
        "axis0": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    return make_model(nodes, [tensor("x", x_shape)], [tensor("y", ["B", "F"])], consts)


def assert_same_graph(a: Graph, b: Graph) -> None:
    assert a.name == b.name
    assert a.inputs == b.inputs
    assert a.outputs == b.outputs
    assert a.nodes == b.nodes
    assert dict(a.values) == dict(b.values)
    assert a.constants.keys() == b.constants.keys()
    for name, array in a.constants.items():
        np.testing.assert_array_equal(array, b.constants[name])
        assert array.dtype == b.constants[name].dtype
    assert a.opset == b.opset


# --- loading -----------------------------------------------------------------------------


def test_path_bytes_and_proto_give_the_same_graph(tmp_path):
    model = mlp_model()
    path = tmp_path / "mlp.onnx"
    onnx.save_model(model, path)
    from_path = load_graph(path)
    from_str_path = load_graph(str(path))
    from_bytes = load_graph(model.SerializeToString())
    from_proto = load_graph(model)
    for other in (from_str_path, from_bytes, from_proto):
        assert_same_graph(from_path, other)
    assert [n.op_type for n in from_path.nodes] == ["MatMul", "Add", "Relu"]
    assert from_path.inputs[0].shape == (2, 4)
    assert from_path.outputs[0].shape == (2, 3)
    np.testing.assert_array_equal(
        from_path.constants["w"], numpy_helper.to_array(model.graph.initializer[0])
    )


def test_load_model_copies_the_callers_proto():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [3])], [tensor("y", [3])]
    )
    before = model.SerializeToString()
    loaded = load_model(model)
    graph = load_graph(model)
    assert loaded is not model
    assert model.SerializeToString() == before
    assert model.graph.node[0].name == ""
    assert graph.nodes[0].name == "Relu_0"


def test_external_data_is_resolved_next_to_the_model(tmp_path):
    model = mlp_model()
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "mlp.onnx"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp.weights",
        size_threshold=0,
    )
    assert (folder / "mlp.weights").is_file()
    cwd = os.getcwd()
    os.chdir(tmp_path)  # external data must not be looked up relative to the cwd
    try:
        graph = load_graph(path)
    finally:
        os.chdir(cwd)
    reference = mlp_model()  # save_model moved ``model``'s weights out to the file
    for init in reference.graph.initializer:
        np.testing.assert_array_equal(graph.constants[init.name], numpy_helper.to_array(init))
    assert_same_graph(graph, load_graph(reference))


def test_missing_external_data_file_is_a_model_error(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save_model(
        mlp_model(),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp.weights",
        size_threshold=0,
    )
    (tmp_path / "mlp.weights").unlink()
    with pytest.raises(ModelError, match="mlp"):
        load_graph(path)


def test_missing_file_is_a_model_error(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelError, match=r"nope\.onnx"):
        load_model(missing)


@pytest.mark.parametrize(
    "data",
    [b"this is not an onnx model", b"\xff\xff\xff\xff", mlp_model().SerializeToString()[:-9]],
)
def test_corrupted_bytes_are_a_model_error(data):
    with pytest.raises(ModelError):
        load_model(data)


def test_corrupted_file_is_a_model_error(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\xff\xff\xff\xff garbage")
    with pytest.raises(ModelError, match=r"broken\.onnx"):
        load_graph(path)


def test_checker_failure_names_the_node():
    bad = make_model(
        [helper.make_node("Add", ["x"], ["y"], name="lonely_add")],  # Add needs two inputs
        [tensor("x", [3])],
        [tensor("y", [3])],
    )
    with pytest.raises(ModelError, match="lonely_add"):
        load_model(bad)
    with pytest.raises(ModelError, match="checker"):
        load_graph(bad.SerializeToString())


def test_undefined_input_fails_the_checker():
    bad = make_model(
        [helper.make_node("Relu", ["ghost"], ["y"], name="r")],
        [tensor("x", [3])],
        [tensor("y", [3])],
    )
    with pytest.raises(ModelError, match="ghost"):
        load_graph(bad)


def test_opset_newer_than_onnx_knows_is_a_model_error():
    opset = onnx.defs.onnx_opset_version() + 1
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [tensor("x", [3])],
        [tensor("y", [3])],
        opset=opset,
    )
    with pytest.raises(ModelError, match=f"opset {opset}"):
        load_model(model)


@pytest.mark.parametrize("opset", [1, 6])
def test_opsets_older_than_7_are_converted(opset):
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [tensor("x", [3])],
        [tensor("y", [3])],
        opset=opset,
    )
    graph = load_graph(model)
    assert graph.opset == 7
    assert [n.op_type for n in graph.nodes] == ["Relu"]


def test_oldest_supported_opset_loads():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [3])], [tensor("y", [3])], opset=7
    )
    assert load_graph(model).opset == 7


def test_not_a_model_source_is_a_model_error():
    with pytest.raises(ModelError, match="int"):
        load_model(42)


# --- unsupported ops ---------------------------------------------------------------------


def test_every_unsupported_op_is_reported_at_once():
    nodes = [
        helper.make_node("Sin", ["x"], ["a"], name="sin_a"),
        helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
        helper.make_node("Cos", ["b"], ["c"], name="cos_c"),
        helper.make_node("Sin", ["c"], ["y"], name="sin_y"),
    ]
    model = make_model(nodes, [tensor("x", [3])], [tensor("y", [3])])
    with pytest.raises(UnsupportedOpError) as info:
        load_graph(model, supported_ops={"Relu", "Add"})
    assert info.value.ops == {"Cos": ["cos_c"], "Sin": ["sin_a", "sin_y"]}
    for name in ("sin_a", "sin_y", "cos_c", "Sin", "Cos"):
        assert name in str(info.value)
    assert "relu_b" not in str(info.value)
    assert len(load_graph(model, supported_ops={"Sin", "Cos", "Relu"}).nodes) == 4


def test_custom_domain_ops_are_keyed_with_their_domain():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r"),
        helper.make_node("FastGelu", ["a"], ["y"], name="gelu", domain="com.example"),
    ]
    model = make_model(
        nodes,
        [tensor("x", [3])],
        [tensor("y", [3])],
        extra_opsets=[helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(UnsupportedOpError) as info:
        load_graph(model, supported_ops={"Relu", "FastGelu"})
    assert info.value.ops == {"com.example.FastGelu": ["gelu"]}
    graph = load_graph(model, supported_ops={"Relu", "com.example.FastGelu"})
    gelu = graph.nodes[1]
    assert (gelu.domain, gelu.opset) == ("com.example", 1)
    assert graph.outputs[0].shape == (3,)  # declared output type is used


def test_ops_only_in_folded_subgraphs_do_not_count():
    graph = load_graph(shape_chain_model([2, 3, 4]), supported_ops={"Reshape", "Relu"})
    assert [n.op_type for n in graph.nodes] == ["Reshape", "Relu"]


def test_control_flow_is_reported_like_any_other_op():
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [], [tensor("t", [3])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor("e", [3])]
    )
    nodes = [
        helper.make_node(
            "If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g
        )
    ]
    model = make_model(
        nodes, [tensor("x", [3]), tensor("cond", [], TensorProto.BOOL)], [tensor("y", [3])]
    )
    with pytest.raises(UnsupportedOpError) as info:
        load_graph(model, supported_ops={"Relu", "Neg"})
    assert info.value.ops == {"If": ["branch"]}
    graph = load_graph(model)
    assert isinstance(graph.nodes[0].attr("then_branch"), onnx.GraphProto)
    assert graph.values["cond"].dtype == "bool"


# --- shape inference and folding ---------------------------------------------------------


def test_shape_gather_concat_reshape_chain_folds_to_one_reshape():
    graph = load_graph(shape_chain_model([2, 3, 4]))
    assert [n.op_type for n in graph.nodes] == ["Reshape", "Relu"]
    reshape = graph.nodes[0]
    assert reshape.inputs[0] == "x"
    assert graph.is_constant(reshape.inputs[1])
    np.testing.assert_array_equal(graph.constants[reshape.inputs[1]], [2, -1])
    assert graph.constants[reshape.inputs[1]].dtype == np.int64
    assert graph.value("flat").shape == (2, 12)
    assert graph.outputs[0].shape == (2, 12)
    # the dead pieces of the folded chain are gone, not left as constants
    assert not {"s", "batch", "zero"} & set(graph.constants)


def test_symbolic_dims_keep_the_shape_chain():
    graph = load_graph(shape_chain_model(["N", 3, 4]))
    assert "Shape" in [n.op_type for n in graph.nodes]
    assert graph.inputs[0].shape == ("N", 3, 4)
    assert not graph.is_static


def test_input_shapes_pin_a_symbolic_batch_dim():
    graph = load_graph(shape_chain_model(["N", 3, 4]), input_shapes={"x": (5, 3, 4)})
    assert graph.inputs[0].shape == (5, 3, 4)
    assert graph.is_static
    assert [n.op_type for n in graph.nodes] == ["Reshape", "Relu"]
    np.testing.assert_array_equal(graph.constants[graph.nodes[0].inputs[1]], [5, -1])
    for name in ("flat", "y"):
        assert graph.value(name).shape == (5, 12)
        assert graph.value(name).is_static


def test_input_shapes_errors_are_input_errors():
    model = shape_chain_model(["N", 3, 4])
    with pytest.raises(InputError, match="nope"):
        load_graph(model, input_shapes={"nope": (1, 3, 4)})
    with pytest.raises(InputError, match="dim 1"):
        load_graph(model, input_shapes={"x": (1, 7, 4)})
    with pytest.raises(InputError, match="rank"):
        load_graph(model, input_shapes={"x": (1, 12)})


def test_shape_with_start_folds_when_the_sliced_dims_are_static():
    nodes = [
        helper.make_node("Shape", ["x"], ["tail"], start=1),
        helper.make_node("Shape", ["x"], ["all"]),
        helper.make_node("Size", ["z"], ["n"]),
        helper.make_node("Concat", ["tail", "all"], ["y"], axis=0),
    ]
    model = make_model(
        nodes,
        [tensor("x", ["N", 3, 4]), tensor("z", [2, 5])],
        [tensor("y", [5], I64), tensor("n", [], I64)],
    )
    graph = load_graph(model)
    assert [n.op_type for n in graph.nodes] == ["Shape", "Concat"]
    np.testing.assert_array_equal(graph.constants["tail"], [3, 4])
    assert graph.constants["n"] == 10  # a graph output that became a constant
    assert graph.outputs[1] == graph.value("n")
    assert graph.outputs[1].shape == ()


def test_constant_nodes_of_every_form_become_constants():
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("sv", F, [2], [1.5, 2.5]),
        helper.make_tensor("si", I64, [2], [1, 3]),
        [4],
    )
    forms = {
        "c_value": {"value": numpy_helper.from_array(np.array([1, 2, 3, 4], np.float32))},
        "c_float": {"value_float": 2.0},
        "c_floats": {"value_floats": [1.0, 2.0, 3.0, 4.0]},
        "c_int": {"value_int": 7},
        "c_ints": {"value_ints": [1, 2]},
        "c_sparse": {"sparse_value": sparse},
        "c_string": {"value_string": "hello"},
    }
    nodes = [helper.make_node("Constant", [], [name], **attrs) for name, attrs in forms.items()]
    nodes += [
        helper.make_node("Add", ["x", "c_value"], ["a"]),
        helper.make_node("Mul", ["a", "c_float"], ["b"]),
        helper.make_node("Sub", ["b", "c_floats"], ["d"]),
        helper.make_node("Add", ["d", "c_sparse"], ["y"]),
        helper.make_node("Cast", ["c_int"], ["i"], to=F),
        helper.make_node("Identity", ["c_ints"], ["ii"]),
        helper.make_node("Identity", ["c_string"], ["s"]),
    ]
    outputs = [
        tensor("y", [4]),
        tensor("i", []),
        tensor("ii", [2], I64),
        tensor("s", [], TensorProto.STRING),
    ]
    graph = load_graph(make_model(nodes, [tensor("x", [4])], outputs))
    assert [n.op_type for n in graph.nodes] == ["Add", "Mul", "Sub", "Add"]
    np.testing.assert_array_equal(graph.constants["c_value"], [1, 2, 3, 4])
    assert graph.constants["c_float"].dtype == np.float32
    np.testing.assert_array_equal(graph.constants["c_sparse"], [0, 1.5, 0, 2.5])
    assert graph.constants["i"] == 7.0 and graph.constants["i"].dtype == np.float32
    np.testing.assert_array_equal(graph.constants["ii"], [1, 2])
    assert graph.constants["ii"].dtype == np.int64
    assert graph.constants["s"] == "hello"
    assert graph.value("c_sparse").shape == (4,)


def test_initializers_listed_as_inputs_are_constants_not_inputs():
    w = numpy_helper.from_array(np.ones((3,), np.float32), "w")
    graph_proto = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "old_style",
        [tensor("x", [3]), tensor("w", [3])],
        [tensor("y", [3])],
        initializer=[w],
    )
    model = helper.make_model(
        graph_proto, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]
    )
    graph = load_graph(model)
    assert [v.name for v in graph.inputs] == ["x"]
    assert graph.is_constant("w")
    assert graph.value("w").dtype == "float32"
    with pytest.raises(InputError):
        load_graph(model, input_shapes={"w": (3,)})


def test_constant_subexpressions_are_evaluated_and_disappear():
    consts = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.full((2, 3), 2, np.float32),
    }
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["ab"]),
        helper.make_node("Transpose", ["ab"], ["abt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "abt"], ["y"]),
    ]
    graph = load_graph(make_model(nodes, [tensor("x", [4, 3])], [tensor("y", [4, 2])], consts))
    assert [n.op_type for n in graph.nodes] == ["MatMul"]
    np.testing.assert_array_equal(graph.constants["abt"], (consts["a"] * 2).T)
    assert set(graph.constants) == {"abt"}  # a, b and ab are dead after folding
    assert not graph.constants["abt"].flags.writeable
    assert graph.constants["abt"].flags.c_contiguous


def test_random_ops_are_never_folded():
    nodes = [
        helper.make_node("RandomNormal", [], ["r"], shape=[3], seed=1.0),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    graph = load_graph(make_model(nodes, [tensor("x", [3])], [tensor("y", [3])]))
    assert [n.op_type for n in graph.nodes] == ["RandomNormal", "Add"]
    assert graph.value("r").shape == (3,)


def test_huge_outputs_are_not_folded():
    side = int(np.sqrt(MAX_FILL_ELEMENTS)) + 1
    value = numpy_helper.from_array(np.array([0.5], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["big_shape"], ["big"], value=value),
        helper.make_node("ConstantOfShape", ["small_shape"], ["small"], value=value),
        helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        helper.make_node("ReduceSum", ["small"], ["z"], keepdims=0),
    ]
    consts = {
        "big_shape": np.array([side, side], np.int64),
        "small_shape": np.array([2, 2], np.int64),
    }
    model = make_model(nodes, [], [tensor("y", []), tensor("z", [])], consts)
    graph = load_graph(model)
    assert [n.op_type for n in graph.nodes] == ["ConstantOfShape", "ReduceSum"]
    assert graph.value("big").shape == (side, side)
    assert graph.constants["z"] == 2.0
    np.testing.assert_array_equal(graph.nodes[0].attr("value"), [0.5])


def test_a_weight_filled_by_constant_of_shape_is_folded_above_the_general_limit():
    """A ConstantOfShape output takes its memory folded or not; folded, it is not filled
    on every run. Another op's output of that size stays a node."""
    side = int(np.sqrt(MAX_FOLD_ELEMENTS)) + 1
    value = numpy_helper.from_array(np.array([0.5], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["w"], value=value),
        helper.make_node("Expand", ["one", "shape"], ["e"]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("ReduceSum", ["e"], ["z"], keepdims=0),
    ]
    consts = {"shape": np.array([side, side], np.int64), "one": np.ones(1, np.float32)}
    model = make_model(
        nodes, [tensor("x", [1, side])], [tensor("y", [1, side]), tensor("z", [])], consts
    )
    graph = load_graph(model)
    assert [n.op_type for n in graph.nodes] == ["Expand", "MatMul", "ReduceSum"]
    assert graph.constants["w"].shape == (side, side)
    assert float(graph.constants["w"][-1, -1]) == 0.5


# --- graph building ----------------------------------------------------------------------


def test_unnamed_nodes_are_named_by_op_type_and_index():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"], name="dup"),
        helper.make_node("Abs", ["b"], ["c"], name="dup"),
        helper.make_node("Neg", ["c"], ["d"], name="dup_1"),
        helper.make_node("Sigmoid", ["d"], ["y"]),
    ]
    graph = load_graph(make_model(nodes, [tensor("x", [3])], [tensor("y", [3])]))
    names = [n.name for n in graph.nodes]
    assert names == ["Relu_0", "dup", "dup_2", "dup_1", "Sigmoid_4"]
    assert len(set(names)) == len(names)


def test_node_names_count_folded_nodes_in_the_index():
    graph = load_graph(shape_chain_model([2, 3, 4]))
    assert [n.name for n in graph.nodes] == ["Reshape_4", "Relu_5"]


def test_attributes_become_python_values():
    w = np.ones((4, 1, 3, 3), np.float32)
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w"],
            ["c"],
            name="conv",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            auto_pad="NOTSET",
        ),
        helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.25),
    ]
    graph = load_graph(
        make_model(nodes, [tensor("x", [1, 1, 5, 5])], [tensor("y", [1, 4, 5, 5])], {"w": w})
    )
    conv = graph.nodes[0]
    assert conv.attr("kernel_shape") == (3, 3)
    assert conv.attr("pads") == (1, 1, 1, 1)
    assert conv.attr("auto_pad") == "NOTSET"
    assert conv.attr("group", 1) == 1
    assert graph.nodes[1].attr("alpha") == pytest.approx(0.25)
    assert conv.opset == 17 and conv.domain == ""
    assert graph.opset == 17
    assert graph.value("c").shape == (1, 4, 5, 5)


def test_values_type_inputs_intermediates_outputs_and_constants():
    nodes = [
        helper.make_node("Greater", ["x", "t"], ["mask"]),
        helper.make_node("Cast", ["mask"], ["y"], to=I64),
    ]
    model = make_model(
        nodes,
        [tensor("x", ["batch", None, 2])],
        [tensor("y", ["batch", None, 2], I64)],
        {"t": np.zeros(2, np.float32)},
    )
    graph = load_graph(model)
    assert graph.value("x").dtype == "float32"
    assert graph.value("t").dtype == "float32"
    assert graph.value("mask").dtype == "bool"
    assert graph.value("y").dtype == "int64"
    batch, unknown, two = graph.value("x").shape
    assert batch == "batch" and two == 2
    assert isinstance(unknown, str) and unknown.startswith("?")
    assert graph.inputs[0] is graph.value("x")


# --- real models -------------------------------------------------------------------------

LIGHT_MODELS = sorted(
    glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_*.onnx"))
)


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=os.path.basename)
def test_light_zoo_models_load_fully_typed(path):
    graph = load_graph(path)
    assert graph.is_static
    assert graph.outputs[0].shape[-1] == 1000 or graph.outputs[0].shape[1] == 1000
    for node in graph.nodes:  # weights are folded unless too big to fold
        if node.op_type == "ConstantOfShape":
            assert np.prod(graph.value(node.outputs[0]).shape) > MAX_FOLD_ELEMENTS
    used = {name for node in graph.nodes for name in node.inputs if name}
    for node in graph.nodes:
        for name in node.inputs:
            assert graph.value(name).is_static or name == "", (node.name, name)
        for name in set(node.outputs) & used:  # onnx leaves unused Dropout-7 masks untyped
            assert graph.value(name).is_static, (node.name, name)


def test_light_zoo_models_are_found():
    assert len(LIGHT_MODELS) == 9
