"""Softmax and LogSoftmax (polyonnx/krnl/ops/softmax.py): opset 11 normalises over every
dim from ``axis`` on (the input coerced to 2-D), opset 13 over the single ``axis``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx
from tests.helpers import check_node, fast, node_model, random_array, seeds, shapes

SOFTMAX_TOL = {"rtol": 2e-5, "atol": 1e-6}
"""exp is a polynomial approximation (a few ulps) and the sum has up to 4096 terms."""
LOG_SOFTMAX_TOL = {"rtol": 2e-5, "atol": 1e-5}
"""log(sum) adds an absolute error of a few ulps of the (up to ~10) shifted values."""

MAX_SIZE = 4096


def _softmax(x: np.ndarray, axes: tuple[int, ...], log: bool) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - np.max(x, axis=axes, keepdims=True)
    total = np.sum(np.exp(shifted), axis=axes, keepdims=True)
    return shifted - np.log(total) if log else np.exp(shifted) / total


def _axes(rank: int, axis: int | None, opset: int) -> tuple[int, ...]:
    if opset >= 13:
        return ((-1 if axis is None else axis) % rank,)
    axis = 1 if axis is None else axis
    return tuple(range(axis % rank if axis != rank else rank, rank))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
@fast(15)
@given(data=st.data(), seed=seeds)
def test_softmax(op, opset, data, seed):
    shape = data.draw(shapes(min_rank=1, max_size=MAX_SIZE), label="shape")
    rank = len(shape)
    axis = data.draw(st.none() | st.integers(-rank, rank - 1), label="axis")
    if opset == 11 and axis is None and rank < 2:
        axis = 0  # the default axis 1 only exists from rank 2 on
    x = random_array(np.random.default_rng(seed), shape, np.float32, -10, 10)
    log = op == "LogSoftmax"
    expected = _softmax(x, _axes(rank, axis, opset), log).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    tol = LOG_SOFTMAX_TOL if log else SOFTMAX_TOL
    check_node(op, [x], expected, tol=tol, opset=opset, **attrs)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [-4, -3, -2, -1, 0, 1, 2, 3])
def test_softmax_every_axis(op, opset, axis):
    """Every axis of a rank-4 tensor, both ways of naming it; at opset 11, the result
    differs from opset 13's for every axis but the last."""
    x = random_array(np.random.default_rng(axis + 7), (3, 5, 2, 17), np.float32, -10, 10)
    log = op == "LogSoftmax"
    expected = _softmax(x, _axes(4, axis, opset), log).astype(np.float32)
    if opset == 11 and axis % 4 != 3:
        assert not np.allclose(expected, _softmax(x, (axis % 4,), log))
    tol = LOG_SOFTMAX_TOL if log else SOFTMAX_TOL
    check_node(op, [x], expected, tol=tol, opset=opset, axis=axis)


def test_softmax_rows_sum_to_one_for_large_inputs():
    """Max-shifting: huge logits neither overflow nor give NaN."""
    x = np.array([[1000, 1001, 1002], [-1000, -1000, -1000], [3.4e38, 0, -3.4e38]], np.float32)
    check_node("Softmax", [x], _softmax(x, (1,), False).astype(np.float32), tol=SOFTMAX_TOL)
    with np.errstate(over="ignore"):  # -6.8e38 is -inf in float32, as in the kernel
        expected = _softmax(x, (1,), True).astype(np.float32)
    check_node("LogSoftmax", [x], expected, tol={"rtol": 1e-5, "atol": 1e-4})


@fast(10)
@given(shape=shapes(min_rank=1, max_rank=3, max_size=MAX_SIZE), seed=seeds)
def test_softmax_float64(shape, seed):
    x = random_array(np.random.default_rng(seed), shape, np.float64, -10, 10)
    check_node("Softmax", [x], _softmax(x, (-1 % len(shape),), False), opset=13)


@pytest.mark.parametrize(("opset", "axis"), [(13, 2), (13, -3), (11, -3)])
def test_softmax_rejects_out_of_range_axis(opset, axis):
    x = np.ones((2, 3), np.float32)
    model, _ = node_model("Softmax", [x], [(np.float32, 2)], opset=opset, axis=axis)
    with pytest.raises(polyonnx.ModelError, match=f"'softmax_node'.*'axis' {axis} is out of range"):
        polyonnx.InferenceSession(model)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [(128,), (3, 131), (2, 200), (1021,), (2, 3, 257), (5, 127)])
def test_softmax_long_rows(op, shape):
    """Rows of at least two lane blocks take the two-stage max and sum (partials per
    row); lengths that are not multiples of the block leave partials short."""
    x = random_array(np.random.default_rng(len(shape)), shape, np.float32, -10, 10)
    log = op == "LogSoftmax"
    expected = _softmax(x, (len(shape) - 1,), log).astype(np.float32)
    check_node(op, [x], expected, tol=LOG_SOFTMAX_TOL if log else SOFTMAX_TOL, opset=13)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_long_rows_with_large_and_nan_values(op):
    x = random_array(np.random.default_rng(3), (3, 300), np.float32, -10, 10)
    x[0, 217] = 3.0e38  # the max sits in a late partial
    x[1, :] = -1000.0
    x[2, 5] = np.nan
    log = op == "LogSoftmax"
    with np.errstate(over="ignore", invalid="ignore"):
        expected = _softmax(x, (1,), log).astype(np.float32)
    got = polyonnx.InferenceSession(node_model(op, [x], [(np.float32, 2)], opset=13)[0]).run(
        None, {"x0": x}
    )[0]
    np.testing.assert_allclose(got[:2], expected[:2], rtol=1e-5, atol=1e-4)
    assert np.isnan(got[2]).all()


SPECIALS = st.sampled_from([np.nan, np.inf, -np.inf, 3.0e38, -3.0e38])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@fast(15)
@given(
    rows=st.integers(1, 4),
    n=st.integers(1, 300),
    picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 299), SPECIALS), max_size=4),
    seed=seeds,
)
def test_softmax_rows_with_nan_and_inf(op, rows, n, picks, seed):
    """The row max does not propagate NaN (max_nnan); numpy's does. Either way a row with
    a NaN (or a +inf, whose shift is inf - inf) comes out all NaN, the same rows as numpy."""
    x = random_array(np.random.default_rng(seed), (rows, n), np.float32, -10, 10)
    for row, col, value in picks:
        x[row % rows, col % n] = value
    log = op == "LogSoftmax"
    with np.errstate(over="ignore", invalid="ignore"):
        expected = _softmax(x, (1,), log).astype(np.float32)
    model, _ = node_model(op, [x], [(np.float32, 2)], opset=13)
    got = polyonnx.InferenceSession(model).run(None, {"x0": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4, equal_nan=True)
