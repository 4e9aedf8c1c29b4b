"""Views (polyonnx/krnl/ops/views.py): Reshape, Flatten, Squeeze, Unsqueeze, Identity and
Dropout re-index storage without copying; graph outputs that are views must still come
back as correct, independent arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from tests.helpers import (
    assert_matches,
    check_node,
    const,
    fast,
    make_model,
    node_model,
    random_array,
    seeds,
    shapes,
    value_info,
)


@st.composite
def reshapes(draw):
    """An input shape and a valid Reshape target for it: the input's dims regrouped into
    new dims, with 1s inserted, one dim possibly -1 and dims equal to the input's at the
    same position possibly 0 ("copy")."""
    shape = draw(shapes())
    factors = list(draw(st.permutations(shape)))
    target = []
    while factors:
        take = draw(st.integers(1, len(factors)))
        target.append(int(np.prod(factors[:take])))
        factors = factors[take:]
    for _ in range(draw(st.integers(0, 2))):
        target.insert(draw(st.integers(0, len(target))), 1)
    spec = list(target)
    for i, n in enumerate(target):
        if i < len(shape) and shape[i] == n and draw(st.booleans()):
            spec[i] = 0
    if spec and draw(st.booleans()):
        spec[draw(st.integers(0, len(spec) - 1))] = -1
    return shape, spec, tuple(target)


@fast(25)
@given(case=reshapes(), seed=seeds)
def test_reshape(case, seed):
    shape, spec, target = case
    x = random_array(np.random.default_rng(seed), shape)
    check_node("Reshape", [x, const(np.array(spec, np.int64))], x.reshape(target))


@fast(10)
@given(case=reshapes(), seed=seeds)
def test_reshape_allowzero_without_zeros(case, seed):
    """allowzero=1 changes nothing when the target has no 0."""
    shape, _, target = case
    x = random_array(np.random.default_rng(seed), shape)
    spec = const(np.array(target, np.int64))
    check_node("Reshape", [x, spec], x.reshape(target), opset=14, allowzero=1)


@pytest.mark.parametrize("allowzero", [0, 1])
def test_reshape_zero_copies_unless_allowzero(allowzero):
    x = random_array(np.random.default_rng(0), (0, 3, 4))
    target = (0, 12) if allowzero == 0 else (3, 0, 4)
    spec = [0, 12] if allowzero == 0 else [3, 0, 4]
    check_node(
        "Reshape",
        [x, const(np.array(spec, np.int64))],
        x.reshape(target),
        opset=14,
        allowzero=allowzero,
    )


def test_reshape_shape_from_a_graph_input():
    """The target shape fed at run time: compiled per distinct value, correct each time."""
    x = random_array(np.random.default_rng(1), (4, 6))
    model = make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [value_info("x", np.float32, x.shape), value_info("shape", np.int64, [2])],
        [value_info("y", np.float32, [None, None])],
    )
    session = polyonnx.InferenceSession(model)
    for spec in ([3, 8], [-1, 2], [24, 1], [0, -1], [3, 8]):
        (got,) = session.run(None, {"x": x, "shape": np.array(spec, np.int64)})
        want = x.reshape([x.shape[i] if v == 0 else v for i, v in enumerate(spec)])
        assert_matches(got, want)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([-1, -1], r"shape \[-1, -1\] may hold one -1"),
        ([4, 2], r"cannot reshape \(2, 3\)"),
        ([-2, 3], r"shape \[-2, 3\] may hold one -1 and no other negative value"),
    ],
)
def test_reshape_rejects_bad_targets(spec, message):
    x = np.ones((2, 3), np.float32)
    model, _ = node_model("Reshape", [x, const(np.array(spec))], [(np.float32, 2)])
    with pytest.raises(polyonnx.PolyonnxError, match=f"'reshape_node'.*{message}"):
        polyonnx.InferenceSession(model)


# ---- Flatten --------------------------------------------------------------------------


@fast(20)
@given(data=st.data(), seed=seeds)
def test_flatten(data, seed):
    shape = data.draw(shapes(), label="shape")
    rank = len(shape)
    axis = data.draw(st.none() | st.integers(-rank, rank), label="axis")
    x = random_array(np.random.default_rng(seed), shape)
    if axis is None and rank == 0:
        axis = 0  # the default axis 1 does not exist for a scalar
    at = 1 if axis is None else axis + rank if axis < 0 else axis
    lead = int(np.prod(shape[:at], dtype=np.int64))
    attrs = {} if axis is None else {"axis": axis}
    check_node("Flatten", [x], x.reshape(lead, -1), **attrs)


def test_flatten_every_axis():
    x = random_array(np.random.default_rng(2), (2, 3, 5, 7))
    for axis in range(-4, 5):
        at = axis % 4 if axis < 0 else axis
        check_node("Flatten", [x], x.reshape(int(np.prod(x.shape[:at])), -1), axis=axis)


@pytest.mark.parametrize("axis", [3, -3])
def test_flatten_rejects_out_of_range_axis(axis):
    model, _ = node_model("Flatten", [np.ones((2, 3), np.float32)], [(np.float32, 2)], axis=axis)
    with pytest.raises(polyonnx.ModelError, match=f"'flatten_node'.*'axis' {axis} is out of range"):
        polyonnx.InferenceSession(model)


# ---- Squeeze, Unsqueeze ---------------------------------------------------------------


@st.composite
def with_unit_dims(draw):
    """A shape with some dims set to 1, and a non-empty set of its unit axes (or None)."""
    shape = list(draw(shapes(min_rank=1)))
    for a in draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)):
        shape[a] = 1
    units = [a for a, n in enumerate(shape) if n == 1]
    picked = draw(st.none() | st.sets(st.sampled_from(units), min_size=1))
    if picked is None:
        return tuple(shape), None
    rank = len(shape)
    return tuple(shape), [a - rank if draw(st.booleans()) else a for a in sorted(picked)]


@pytest.mark.parametrize("opset", [11, 13])
@fast(20)
@given(case=with_unit_dims(), seed=seeds)
def test_squeeze(opset, case, seed):
    shape, axes = case
    x = random_array(np.random.default_rng(seed), shape)
    expected = np.squeeze(x, axis=None if axes is None else tuple(axes))
    if axes is None:
        check_node("Squeeze", [x], expected, opset=opset)
    elif opset >= 13:
        check_node("Squeeze", [x, const(np.array(axes, np.int64))], expected, opset=opset)
    else:
        check_node("Squeeze", [x], expected, opset=opset, axes=axes)


@pytest.mark.parametrize("opset", [11, 13])
@fast(20)
@given(data=st.data(), seed=seeds)
def test_unsqueeze(opset, data, seed):
    """Axes index the output (rank + len(axes)), negative ones too."""
    shape = data.draw(shapes(max_rank=3), label="shape")
    out_rank = len(shape) + data.draw(st.integers(1, 3), label="added")
    chosen = data.draw(st.sets(st.integers(0, out_rank - 1), min_size=out_rank - len(shape),
                               max_size=out_rank - len(shape)), label="axes")  # fmt: skip
    axes = [a - out_rank if data.draw(st.booleans()) else a for a in sorted(chosen)]
    x = random_array(np.random.default_rng(seed), shape)
    expected = np.expand_dims(x, tuple(axes))
    if opset >= 13:
        check_node("Unsqueeze", [x, const(np.array(axes, np.int64))], expected, opset=opset)
    else:
        check_node("Unsqueeze", [x], expected, opset=opset, axes=axes)


@pytest.mark.parametrize(
    ("op", "axes", "message"),
    [
        ("Squeeze", [0], r"axes \[0\]: axis 0 has size 2, not 1"),
        ("Squeeze", [2], r"axes \[2\]: axis 2 is out of range .*for rank 2"),
        ("Unsqueeze", [3], r"axes \[3\]: axis 3 is out of range"),
        ("Unsqueeze", [1, -3], r"axes \[1, -3\] repeats an axis"),
    ],
)
def test_squeeze_unsqueeze_reject_bad_axes(op, axes, message):
    x = np.ones((2, 3), np.float32)
    model, _ = node_model(op, [x, const(np.array(axes))], [(np.float32, 2)], opset=13)
    with pytest.raises(polyonnx.ModelError, match=f"'{op.lower()}_node'.*{message}"):
        polyonnx.InferenceSession(model)


# ---- Identity, Dropout --------------------------------------------------------------------


@fast(10)
@given(shape=shapes(), seed=seeds, dtype=st.sampled_from([np.float32, np.int64, np.bool_]))
def test_identity(shape, seed, dtype):
    x = random_array(np.random.default_rng(seed), shape, dtype)
    check_node("Identity", [x], x)


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("mask", [False, True])
@fast(8)
@given(shape=shapes(), seed=seeds)
def test_dropout_is_identity_at_inference(opset, mask, shape, seed):
    x = random_array(np.random.default_rng(seed), shape)
    args = [x] if opset < 12 else [x, const(np.array(0.5, np.float32))]
    expected = [x, np.ones(shape, np.bool_)] if mask else x
    check_node("Dropout", args, expected, opset=opset)


# ---- outputs that are views ----------------------------------------------------------------


def _owns_memory(arrays: list[np.ndarray], others: list[np.ndarray]) -> None:
    """No returned array shares bytes with another or with an input."""
    for i, a in enumerate(arrays):
        for b in arrays[i + 1 :] + others:
            assert not np.shares_memory(a, b)


def test_output_is_a_view_of_an_input():
    """Reshape as the only node: the output is the input's storage reshaped; it must come
    back as its own array (writing into it must not change the caller's input)."""
    x = random_array(np.random.default_rng(3), (4, 6))
    keep = x.copy()
    model = make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [value_info("x", np.float32, x.shape)],
        [value_info("y", np.float32, [3, 8])],
        {"shape": np.array([3, 8], np.int64)},
    )
    (y,) = polyonnx.InferenceSession(model).run(None, {"x": x})
    assert_matches(y, keep.reshape(3, 8))
    _owns_memory([y], [x])
    y[...] = 0
    np.testing.assert_array_equal(x, keep)


def test_output_is_another_outputs_view():
    """y = Relu(x) and z = Reshape(y) are both outputs: they would share storage; each must
    come back correct and independent of the other."""
    x = random_array(np.random.default_rng(4), (5, 6))
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["y"]),
            helper.make_node("Reshape", ["y", "shape"], ["z"]),
            helper.make_node("Flatten", ["y"], ["w"], axis=0),
        ],
        [value_info("x", np.float32, x.shape)],
        [
            value_info("y", np.float32, [5, 6]),
            value_info("z", np.float32, [None, None]),
            value_info("w", np.float32, [None, None]),
        ],
        {"shape": np.array([3, 10], np.int64)},
    )
    session = polyonnx.InferenceSession(model)
    y, z, w = session.run(None, {"x": x})
    relu = np.maximum(x, 0)
    assert_matches(y, relu)
    assert_matches(z, relu.reshape(3, 10))
    assert_matches(w, relu.reshape(1, 30))
    _owns_memory([y, z, w], [x])
    y[...] = -1
    assert_matches(z, relu.reshape(3, 10))
    (z_only,) = session.run(["z"], {"x": x})
    assert_matches(z_only, relu.reshape(3, 10))


def test_two_outputs_viewing_one_input():
    x = random_array(np.random.default_rng(5), (2, 3, 4))
    model = make_model(
        [
            helper.make_node("Identity", ["x"], ["a"]),
            helper.make_node("Unsqueeze", ["x", "axes"], ["b"]),
            helper.make_node("Squeeze", ["b", "axes"], ["c"]),
        ],
        [value_info("x", np.float32, x.shape)],
        [value_info(n, np.float32, [None] * r) for n, r in (("a", 3), ("b", 4), ("c", 3))],
        {"axes": np.array([0], np.int64)},
    )
    a, b, c = polyonnx.InferenceSession(model).run(None, {"x": x})
    assert_matches(a, x)
    assert_matches(b, x[None])
    assert_matches(c, x)
    _owns_memory([a, b, c], [x])


def test_views_inside_a_chain():
    """A view between two kernels: Relu → Reshape → Flatten → Softmax reads the right
    bytes, and results of one run survive the next run."""
    x = random_array(np.random.default_rng(6), (2, 3, 4))
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Reshape", ["r", "shape"], ["s"]),
            helper.make_node("Flatten", ["s"], ["f"], axis=2),
            helper.make_node("Neg", ["f"], ["y"]),
        ],
        [value_info("x", np.float32, x.shape)],
        [value_info("y", np.float32, [None, None])],
        {"shape": np.array([4, 3, 2], np.int64)},
    )
    session = polyonnx.InferenceSession(model)
    (first,) = session.run(None, {"x": x})
    (second,) = session.run(None, {"x": -x})
    assert_matches(first, -np.maximum(x, 0).reshape(12, 2))
    assert_matches(second, -np.maximum(-x, 0).reshape(12, 2))


def test_same_tensor_listed_twice_as_output():
    x = random_array(np.random.default_rng(7), (2, 3))
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [value_info("x", np.float32, x.shape)],
        [value_info("y", np.float32, [2, 3]), value_info("y", np.float32, [2, 3])],
    )
    first, second = polyonnx.InferenceSession(model).run(None, {"x": x})
    assert_matches(first, np.maximum(x, 0))
    assert_matches(second, np.maximum(x, 0))


def test_views_of_an_output_that_is_a_view_of_an_input_read_the_data():
    """KU = Unsqueeze(K) is an output (a copy of K at the end); Y reads a view of KU."""
    nodes = [
        helper.make_node("Unsqueeze", ["k", "axes"], ["ku"]),
        helper.make_node("Reshape", ["ku", "shape"], ["r"]),
        helper.make_node("Mul", ["r", "r"], ["y"]),
    ]
    model = make_model(
        nodes,
        [value_info("k", np.float32, [6])],
        [value_info("ku", np.float32, [1, 6]), value_info("y", np.float32, [6])],
        {"axes": np.array([0], np.int64), "shape": np.array([6], np.int64)},
    )
    k = np.arange(1, 7, dtype=np.float32)
    ku, y = polyonnx.InferenceSession(model).run(None, {"k": k})
    np.testing.assert_array_equal(ku, k[None])
    np.testing.assert_array_equal(y, k * k)


def test_a_kernel_may_not_write_storage_it_also_reaches_through_a_view():
    """Dependences are per buffer name: a kernel writing a buffer and reading a view of it
    could be reordered wrongly, so lowering refuses it, naming the node."""
    from polyonnx.errors import LoweringError
    from polyonnx.frontend import load_graph
    from polyonnx.krnl import build as kb
    from polyonnx.krnl.ir import Statement
    from polyonnx.krnl.lower import LowerContext

    x = np.zeros((2, 3), np.float32)
    model, _ = node_model("Relu", [x], [(np.float32, 2)])
    graph = load_graph(model)
    ctx = LowerContext(graph)
    node = graph.nodes[0]
    temp = ctx.temp("t", (2, 3), "float32").name
    ctx.view("t.flat", temp, (6,))
    dims = ["i", "j"]
    write = Statement(
        "S0", kb.box("S0", dims, (2, 3)), kb.access(temp, "S0", dims, dims), kb.const(0, "float32")
    )
    read = kb.load(kb.access("t.flat", "S1", dims, ["3*i + j"]), "float32")
    copy = Statement("S1", kb.box("S1", dims, (2, 3)), kb.access(temp, "S1", dims, dims), read)
    with pytest.raises(LoweringError, match=r"Relu node .*reaches its storage as"):
        ctx.kernel(node, [write, copy])
    ctx.kernel(node, [write])  # one name: fine
