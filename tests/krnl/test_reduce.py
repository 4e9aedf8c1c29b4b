"""Reduction lowerings (polyonnx/krnl/ops/reduce.py) against float64 numpy references:
axes as an attribute (opset 11) and as an input (opset 18), keepdims, empty axes,
noop_with_empty_axes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.krnl.ops.reduce import REDUCE
from tests.helpers import (
    assert_matches,
    axes_of,
    check_node,
    const,
    fast,
    make_model,
    node_model,
    random_array,
    seeds,
    shapes,
    sum_tol,
    value_info,
)


def _logsumexp(x, axis, keepdims):
    m = np.max(x, axis=axis, keepdims=True)
    s = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return s if keepdims else np.squeeze(s, axis=axis)


# op → (float64 reference over (x, axis, keepdims), input range)
REDUCE_CASES = {
    "ReduceSum": (np.sum, (-1, 1)),
    "ReduceMean": (np.mean, (-1, 1)),
    "ReduceMax": (np.max, (-1, 1)),
    "ReduceMin": (np.min, (-1, 1)),
    "ReduceProd": (np.prod, (0.8, 1.25)),
    "ReduceL1": (lambda x, axis, keepdims: np.sum(np.abs(x), axis, keepdims=keepdims), (-1, 1)),
    "ReduceL2": (
        lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis, keepdims=keepdims)),
        (-1, 1),
    ),
    "ReduceSumSquare": (lambda x, axis, keepdims: np.sum(x * x, axis, keepdims=keepdims), (-1, 1)),
    "ReduceLogSum": (
        lambda x, axis, keepdims: np.log(np.sum(x, axis, keepdims=keepdims)),
        (0.1, 2),
    ),
    "ReduceLogSumExp": (_logsumexp, (-5, 5)),
}
MAX_SIZE = 4096


def test_every_reduction_is_covered():
    assert set(REDUCE_CASES) == {*REDUCE, "ReduceLogSumExp"}


def _expected(op: str, x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    ref = REDUCE_CASES[op][0]
    axis = None if axes is None else tuple(axes)
    return np.asarray(ref(x.astype(np.float64), axis=axis, keepdims=keepdims)).astype(x.dtype)


def _tol(op: str, x: np.ndarray, axes) -> dict[str, float]:
    n = x.size if axes is None else int(np.prod([x.shape[a] for a in axes]))
    if op == "ReduceProd":  # relative error grows with the number of factors
        return {"rtol": max(1e-5, 2e-7 * n), "atol": 1e-6}
    return sum_tol(n)


def _reduce_args(x, axes, as_input: bool):
    """(args, attrs, opset) giving ``axes`` (None: absent) as an input or an attribute."""
    if as_input:
        args = [x] if axes is None else [x, const(np.array(axes, np.int64))]
        return args, {}, 18
    return [x], ({} if axes is None else {"axes": axes}), 11


@pytest.mark.parametrize("op", sorted(REDUCE_CASES))
@pytest.mark.parametrize("as_input", [False, True], ids=["attr-opset11", "input-opset18"])
@fast(12)
@given(data=st.data(), keepdims=st.booleans(), seed=seeds)
def test_reduce(op, as_input, data, keepdims, seed):
    shape = data.draw(shapes(max_size=MAX_SIZE), label="shape")
    axes = data.draw(st.none() | axes_of(len(shape)), label="axes") if shape else None
    x = random_array(np.random.default_rng(seed), shape, np.float32, *REDUCE_CASES[op][1])
    args, attrs, opset = _reduce_args(x, axes, as_input)
    expected = _expected(op, x, axes, keepdims)
    check_node(
        op, args, expected, tol=_tol(op, x, axes), opset=opset, keepdims=int(keepdims), **attrs
    )


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=lambda d: d.__name__)
@fast(8)
@given(data=st.data(), keepdims=st.booleans(), seed=seeds)
def test_reduce_int(op, dtype, data, keepdims, seed):
    shape = data.draw(shapes(max_rank=3, max_size=512), label="shape")
    axes = data.draw(st.none() | axes_of(len(shape)), label="axes") if shape else None
    low, high = (-1, 2) if op == "ReduceProd" else (-1000, 1000)
    x = random_array(np.random.default_rng(seed), shape, dtype, low, high)
    ref = {"ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min, "ReduceProd": np.prod}
    axis = None if axes is None else tuple(axes)
    expected = np.asarray(ref[op](x, axis=axis, keepdims=keepdims)).astype(dtype)
    args, _, opset = _reduce_args(x, axes, True)
    check_node(op, args, expected, opset=opset, keepdims=int(keepdims))


def test_reduce_max_min_propagate_nan():
    x = np.array([[1, np.nan, 3], [4, 5, 6]], np.float32)
    check_node("ReduceMax", [x], np.max(x, axis=1), axes=[1], keepdims=0, opset=11)
    check_node("ReduceMin", [x], np.min(x, axis=1), axes=[1], keepdims=0, opset=11)


def test_logsumexp_of_minus_infinity():
    """All -inf rows give -inf (not NaN from inf - inf); +inf gives +inf."""
    x = np.array([[-np.inf, -np.inf], [np.inf, 0], [0, 0]], np.float32)
    expected = np.array([-np.inf, np.inf, np.log(2)], np.float32)
    check_node("ReduceLogSumExp", [x], expected, axes=[1], keepdims=0, opset=11)


# ---- empty axes, noop_with_empty_axes ------------------------------------------------


@pytest.mark.parametrize(("op", "opset"), [("ReduceSum", 13), ("ReduceMax", 18), ("ReduceL2", 18)])
@pytest.mark.parametrize("axes_form", ["absent", "empty"])
@pytest.mark.parametrize("noop", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_empty_axes(op, opset, axes_form, noop, keepdims):
    """No axes reduce everything, unless noop_with_empty_axes makes the node an identity."""
    x = random_array(np.random.default_rng(1), (3, 17, 5), np.float32, -1, 1)
    args = [x] if axes_form == "absent" else [x, const(np.zeros((0,), np.int64))]
    expected = x if noop else _expected(op, x, None, bool(keepdims))
    check_node(
        op,
        args,
        expected,
        tol=sum_tol(x.size),
        opset=opset,
        keepdims=keepdims,
        noop_with_empty_axes=noop,
    )


def test_reduce_sum_axes_input_since_opset13():
    x = random_array(np.random.default_rng(2), (4, 5, 6), np.float32, -1, 1)
    expected = x.sum(axis=(0, 2), dtype=np.float64).astype(np.float32)
    check_node(
        "ReduceSum", [x, const(np.array([-1, 0]))], expected, tol=sum_tol(24), opset=13, keepdims=0
    )


def test_reduce_axes_from_a_graph_input():
    """axes fed at run time: the session compiles per distinct value and stays correct."""
    x = random_array(np.random.default_rng(3), (3, 4, 5), np.float32, -1, 1)
    model = make_model(
        [helper.make_node("ReduceMean", ["x", "axes"], ["y"])],
        [value_info("x", np.float32, x.shape), value_info("axes", np.int64, [None])],
        [value_info("y", np.float32, [None] * 3)],
        opset=18,
    )
    session = polyonnx.InferenceSession(model)
    for axes in ([0], [-1], [1, 2], [0], [2, 0]):
        axes = np.array(axes, np.int64)
        (got,) = session.run(None, {"x": x, "axes": axes})
        want = x.astype(np.float64).mean(axis=tuple(axes), keepdims=True).astype(np.float32)
        assert_matches(got, want, sum_tol(60))


@pytest.mark.parametrize(
    ("axes", "message"),
    [
        ([2], r"'axes' \[2\]: axis 2 is out of range .*rank 2"),
        ([-3], r"'axes' \[-3\]: axis -3 is out of range"),
        ([1, -1], r"'axes' \[1, -1\] repeats an axis"),
    ],
)
def test_reduce_rejects_bad_axes(axes, message):
    x = np.ones((2, 3), np.float32)
    model, _ = node_model("ReduceSum", [x, const(np.array(axes))], [(np.float32, 2)], opset=18)
    with pytest.raises(polyonnx.ModelError, match=f"'reducesum_node'.*{message}"):
        polyonnx.InferenceSession(model)


def test_reduce_of_view_output():
    """A reduction whose output is then reshaped: the view of a reduced buffer is correct."""
    x = random_array(np.random.default_rng(4), (6, 7), np.float32, -1, 1)
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=1),
        helper.make_node("Reshape", ["m", "shape"], ["y"]),
    ]
    model = make_model(
        nodes,
        [value_info("x", np.float32, x.shape)],
        [value_info("y", np.float32, [None, None])],
        {"shape": np.array([2, 3], np.int64)},
        opset=11,
    )
    (got,) = polyonnx.InferenceSession(model).run(None, {"x": x})
    assert_matches(got, x.max(axis=1).reshape(2, 3))
