"""The size budget at load (polyonnx/frontend/limits.py, budget.py; docs/limits.md): every
tensor a model declares or computes is checked before it is allocated, and one too big
raises ModelError naming it. The memory-safety cases run in a subprocess under a 2 GiB
address-space cap and a timeout, so a regression fails the test instead of the machine."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyonnx.errors import ArgumentError, ModelError
from polyonnx.frontend import load_graph
from polyonnx.frontend.budget import PROPAGATION_LIMIT, propagation_is_safe, shape_values
from polyonnx.frontend.limits import Limits

F = TensorProto.FLOAT
I64 = TensorProto.INT64
HUGE = 1 << 40


def make_model(nodes, inputs, outputs, initializers=(), opset=17, sparse=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "limits",
        inputs,
        outputs,
        initializer=list(initializers),
        sparse_initializer=list(sparse),
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.array(value, dtype), name)


def range_model(limit: int, then_add: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="rng")]
    inputs = []
    if then_add:  # an Add after the Range made onnx's data propagation allocate 7.8 GB
        nodes.append(helper.make_node("Add", ["r", "x"], ["y"], name="add"))
        inputs = [tensor("x", [1], I64)]
    out = "y" if then_add else "r"
    inits = [const("start", 0), const("limit", limit), const("delta", 1)]
    return make_model(nodes, inputs, [tensor(out, ["n"], I64)], inits)


def constant_of_shape_model(shape) -> onnx.ModelProto:
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")
    return make_model([node], [], [tensor("y", ["n"] * len(shape))], [const("s", shape)])


def propagated_fill_model(factor: int) -> onnx.ModelProto:
    """ConstantOfShape of int64 whose shape Shape → Mul computes: ONNX's data propagation
    materialised it (std::bad_alloc after 2.7 GB for 2**40)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Mul", ["s", "big"], ["lim"]),
        helper.make_node("ConstantOfShape", ["lim"], ["r"], name="fill", value=const("v", [1])),
        helper.make_node("Add", ["r", "zero"], ["y"]),
    ]
    inits = [const("big", [factor]), const("zero", 0)]
    return make_model(nodes, [tensor("x", [1024])], [tensor("y", ["n"], I64)], inits)


def resize_scales_model(scale: float) -> onnx.ModelProto:
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], name="up")
    inits = [const("sc", [1, 1, scale, scale], np.float32)]
    return make_model([node], [tensor("x", [1, 1, 4, 4])], [tensor("y", list("abcd"))], inits)


def resize_sizes_model(sizes) -> onnx.ModelProto:
    node = helper.make_node("Resize", ["x", "", "", "sz"], ["y"], name="up", mode="linear")
    inits = [const("sz", sizes)]
    return make_model([node], [tensor("x", [1, 1, 4, 4])], [tensor("y", list("abcd"))], inits)


def sparse_model(dims, indices=(0,)) -> onnx.ModelProto:
    values = numpy_helper.from_array(np.ones(len(indices), np.float32), "sp")
    index = numpy_helper.from_array(np.array(indices, np.int64), "sp_idx")
    sparse = helper.make_sparse_tensor(values, index, dims)
    node = helper.make_node("Identity", ["sp"], ["y"], name="copy")
    return make_model([node], [], [tensor("y", ["n"] * len(dims))], sparse=[sparse])


def assert_refused(model, *names, limits=None):
    with pytest.raises(ModelError) as info:
        load_graph(model, limits=limits)
    message = str(info.value)
    for name in names:
        assert name in message, message
    return message


# ---- the budget, one negative test per place a tensor comes from -------------------------


def test_range_over_budget_names_tensor_and_node():
    message = assert_refused(range_model(HUGE), "'r'", "Range node 'rng'")
    assert "POLYONNX_MAX_DIM" in message


def test_constant_of_shape_over_budget():
    assert_refused(constant_of_shape_model([1 << 20, 1 << 20]), "'y'", "'fill'", "elements")


def test_expand_over_budget():
    node = helper.make_node("Expand", ["x", "s"], ["y"], name="grow")
    model = make_model(
        [node], [tensor("x", [1])], [tensor("y", ["a", "b"])], [const("s", [1 << 20, 1 << 20])]
    )
    assert_refused(model, "'y'", "Expand node 'grow'")


def test_tile_over_budget():
    node = helper.make_node("Tile", ["x", "r"], ["y"], name="tile")
    model = make_model([node], [tensor("x", [4])], [tensor("y", ["n"])], [const("r", [1 << 30])])
    assert_refused(model, "'y'", "Tile node 'tile'")


def test_resize_by_a_million_over_budget():
    assert_refused(resize_scales_model(1e6), "'y'", "Resize node 'up'")


@pytest.mark.parametrize("x_shape", [[1, 1, 4, 4], [1, 1, "H", "W"]])
def test_conv_with_huge_pads_refused_before_isl(x_shape):
    """Pads beyond Limits.max_dim are refused whether or not the output shape is known."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[HUGE] * 4)
    w = const("w", np.ones((1, 1, 3, 3)), np.float32)
    model = make_model([node], [tensor("x", x_shape)], [tensor("y", list("abcd"))], [w])
    assert_refused(model, "'conv'", "'pads'", "max_dim")


def test_conv_output_over_budget():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1 << 20] * 4)
    w = const("w", np.ones((1, 1, 3, 3)), np.float32)
    model = make_model([node], [tensor("x", [1, 1, 4, 4])], [tensor("y", list("abcd"))], [w])
    assert_refused(model, "'y'", "'conv'", "elements")


def test_graph_input_dims_over_budget():
    node = helper.make_node("Relu", ["x"], ["y"])
    model = make_model([node], [tensor("x", [HUGE])], [tensor("y", [HUGE])])
    assert_refused(model, "'x'")


def header_only(name: str, dims) -> onnx.TensorProto:
    """A float tensor whose dims claim far more than its 16 bytes of data."""
    return onnx.TensorProto(name=name, data_type=F, dims=dims, raw_data=b"\0" * 16)


def test_initializer_dims_over_budget_checked_before_reading():
    w = header_only("w", [1 << 20, 1 << 20])
    node = helper.make_node("Identity", ["w"], ["y"])
    assert_refused(make_model([node], [], [tensor("y", ["a", "b"])], [w]), "'w'")


def test_constant_attribute_over_budget():
    value = header_only("v", [HUGE])
    node = helper.make_node("Constant", [], ["y"], name="c", value=value)
    assert_refused(make_model([node], [], [tensor("y", ["n"])]), "'value'", "'c'")


def test_sparse_initializer_over_budget():
    assert_refused(sparse_model([HUGE]), "'sp'")


def test_sparse_index_outside_dims():
    assert_refused(sparse_model([4], indices=[7]), "sp_idx", "out of range")


def test_external_initializer_checked_before_its_data_is_read(tmp_path):
    w = onnx.TensorProto(name="w", data_type=F, dims=[1 << 20, 1 << 20])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "16")):
        w.external_data.add(key=key, value=value)
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    node = helper.make_node("Identity", ["w"], ["y"])
    path = tmp_path / "m.onnx"
    path.write_bytes(make_model([node], [], [tensor("y", ["a", "b"])], [w]).SerializeToString())
    assert_refused(str(path), "'w'")


def test_several_tensors_over_budget_in_one_error():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Relu", ["x2"], ["b"], name="r2"),
    ]
    model = make_model(
        nodes,
        [tensor("x", [HUGE]), tensor("x2", [HUGE])],
        [tensor("a", [HUGE]), tensor("b", [HUGE])],
    )
    assert_refused(model, "'x'", "'x2'", "'r1'", "'r2'")


def test_range_with_zero_delta_is_malformed():
    model = range_model(10)
    model.graph.initializer[2].CopyFrom(const("delta", 0))
    assert_refused(model, "'rng'", "delta")


# ---- the limits themselves ---------------------------------------------------------------


def test_limits_can_be_lowered_and_raised():
    model = constant_of_shape_model([100])
    load_graph(model)
    assert_refused(model, "'fill'", "100 elements", limits=Limits(max_tensor_elements=50))
    assert_refused(model, "max_tensor_bytes", limits=Limits(max_tensor_bytes=200))
    big = constant_of_shape_model([1 << 31, 2])
    assert_refused(big, "'fill'")
    raised = Limits(max_tensor_elements=1 << 33, max_tensor_bytes=1 << 36, max_dim=1 << 32)
    assert load_graph(big, limits=raised).value("y").shape == (1 << 31, 2)


def test_limits_from_the_environment(monkeypatch):
    monkeypatch.setenv("POLYONNX_MAX_TENSOR_ELEMENTS", "50")
    assert Limits.from_env().max_tensor_elements == 50
    assert_refused(constant_of_shape_model([100]), "POLYONNX_MAX_TENSOR_ELEMENTS")
    monkeypatch.setenv("POLYONNX_MAX_TENSOR_ELEMENTS", "1_000")
    load_graph(constant_of_shape_model([100]))


@pytest.mark.parametrize("text", ["lots", "-5", "0", "2.5"])
def test_bad_environment_limit_is_an_argument_error(monkeypatch, text):
    monkeypatch.setenv("POLYONNX_MAX_DIM", text)
    with pytest.raises(ArgumentError, match=r"POLYONNX_MAX_DIM|max_dim"):
        Limits.from_env()


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "8"])
def test_bad_limits_are_refused(value):
    with pytest.raises(ArgumentError, match="max_tensor_bytes"):
        Limits(max_tensor_bytes=value)


def test_defaults_admit_a_big_llm_weight():
    """A 70B LLM's float32 embedding (128256 x 8192, 4.2 GB) fits the default budget."""
    limits = Limits()
    assert limits.problem([128256, 8192], 4) is None
    assert limits.problem([1 << 32], 1) is not None


def test_propagation_is_off_while_a_growth_output_is_big():
    big = range_model(2 * PROPAGATION_LIMIT, then_add=True)
    small = range_model(PROPAGATION_LIMIT, then_add=True)
    assert not propagation_is_safe(big.graph.node, initializers(big), {})
    assert propagation_is_safe(small.graph.node, initializers(small), {})
    assert load_graph(big).value("y").shape == (2 * PROPAGATION_LIMIT,)


def test_propagation_is_off_while_an_integer_growth_input_is_unknown():
    model = propagated_fill_model(2)
    assert not propagation_is_safe(model.graph.node, initializers(model), {})


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_small_shape_computations_still_propagate():
    """ConstantOfShape(Shape(x)) with small values still folds to a constant."""
    graph = load_graph(propagated_fill_model(2))
    assert graph.value("y").shape == (2048,)


# ---- memory safety: in a subprocess under a 2 GiB address-space cap ------------------------

CAP = 2 << 30
SCRIPT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
    import onnx
    from polyonnx.errors import PolyonnxError
    from polyonnx.frontend import load_graph
    model = onnx.load_model_from_string(sys.stdin.buffer.read())
    try:
        load_graph(model)
    except PolyonnxError as exc:
        print(type(exc).__name__, str(exc).replace("\\n", " "))
    else:
        print("LOADED")
    """
)


def load_capped(model: onnx.ModelProto, timeout: float = 120) -> str:
    """How load_graph ends in a fresh process capped at 2 GiB: the error's type and
    message, or LOADED. A MemoryError, crash or hang fails the test."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(cap=CAP)],
        input=model.SerializeToString(),
        capture_output=True,
        timeout=timeout,
        env={**os.environ, "POLYONNX_MAX_TENSOR_BYTES": "", "POLYONNX_MAX_TENSOR_ELEMENTS": ""},
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    return result.stdout.decode().strip()


@pytest.mark.parametrize(
    ("model", "outcome"),
    [
        pytest.param(range_model(HUGE, then_add=True), "ModelError", id="range-2**40"),
        pytest.param(range_model(1 << 30, then_add=True), "LOADED", id="range-2**30"),
        pytest.param(constant_of_shape_model([HUGE]), "ModelError", id="fill-2**40"),
        pytest.param(propagated_fill_model(1 << 30), "ModelError", id="propagated-fill-2**40"),
        pytest.param(propagated_fill_model(1 << 20), "LOADED", id="propagated-fill-2**30"),
        pytest.param(resize_scales_model(1e6), "ModelError", id="resize-1e6"),
        pytest.param(sparse_model([HUGE]), "ModelError", id="sparse-2**40"),
    ],
)
def test_huge_models_are_refused_or_loaded_within_memory(model, outcome):
    """Within budget (2**30 int64 elements is 8 GiB) the growth op stays a node: neither
    inference nor folding materialises it."""
    got = load_capped(model)
    assert got.split(" ")[0] == outcome, got
    assert outcome == "LOADED" or "docs/limits.md" in got, got  # not onnx's std::bad_alloc


def test_huge_resize_table_is_refused_when_compiled():
    """[1, 1, 2**30, 1] fits the load budget (4 GiB of float32) but not resize's tables
    (8 GiB of them before the limit): compiling it refuses, within 2 GiB."""
    script = SCRIPT.replace("load_graph(model)", "polyonnx.InferenceSession(model)").replace(
        "import onnx\n", "import onnx, polyonnx\n"
    )
    model = resize_sizes_model([1, 1, 1 << 30, 1])
    result = subprocess.run(
        [sys.executable, "-c", script.format(cap=CAP)],
        input=model.SerializeToString(),
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert "MAX_TABLE_ENTRIES" in result.stdout.decode(), result.stdout.decode()


def test_docs_page_names_every_limit_and_its_default():
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "limits.md").read_text()
    for field in dataclasses.fields(Limits):
        assert f"`{field.name}`" in text and f"POLYONNX_{field.name.upper()}" in text
    assert "8 GiB (`8 << 30`)" in text and Limits().max_tensor_bytes == 8 << 30


def symbolic_fill_model() -> onnx.ModelProto:
    """ConstantOfShape(Shape(x)) of int64 on x of symbolic dims [N, 4]."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill", value=const("v", [1])),
        helper.make_node("Identity", ["y"], ["z"]),
    ]
    return make_model(nodes, [tensor("x", ["N", 4])], [tensor("z", ["a", "b"], I64)])


def test_symbolic_sizes_keep_data_propagation():
    """ONNX cannot materialise a fill whose size is symbolic: propagation stays on, and the
    output keeps the input's symbolic dim (a round without it would lose 'N')."""
    model = symbolic_fill_model()
    types = {"x": model.graph.input[0].type}
    assert propagation_is_safe(model.graph.node, {}, types)
    assert not propagation_is_safe(model.graph.node, {}, {})  # x's shape not yet known
    assert load_graph(model).value("y").shape == ("N", 4)


def test_shape_values_follow_shape_computations():
    model = propagated_fill_model(3)
    values = shape_values(model.graph.node, initializers(model), {"x": model.graph.input[0].type})
    assert values["s"] == [1024] and values["lim"] == [3072]
