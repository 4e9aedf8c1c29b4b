"""ArgMax and ArgMin (polyonnx/krnl/ops/argreduce.py) against numpy: every axis (negative
too), keepdims, select_last_index, ties, NaN, integer and float dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import LoweringError, ModelError
from tests.helpers import axis_of, check_node, fast, random_array, run_node, seeds, shapes


def reference(op: str, x: np.ndarray, axis: int, keepdims: bool, last: bool) -> np.ndarray:
    """numpy's arg-reduction (first NaN, else first extreme); ``last`` counts from the end."""
    fn = np.argmax if op == "ArgMax" else np.argmin
    index = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis) if last else fn(x, axis=axis)
    index = np.asarray(index, np.int64)
    return np.expand_dims(index, axis) if keepdims else index


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@fast(20)
@given(
    shape=shapes(1, 4),
    seed=seeds,
    data=st.data(),
    keepdims=st.sampled_from([None, 0, 1]),
    last=st.sampled_from([None, 0, 1]),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint8]),
)
def test_matches_numpy(op, shape, seed, data, keepdims, last, dtype):
    """Values drawn from a handful of integers, so most slices have ties."""
    axis = data.draw(st.one_of(st.none(), axis_of(len(shape))))
    x = random_array(np.random.default_rng(seed), shape, np.int32, 0, 4).astype(dtype)
    attrs = {k: v for k, v in (("axis", axis), ("keepdims", keepdims)) if v is not None}
    if last is not None:
        attrs["select_last_index"] = last
    want = reference(op, x, axis or 0, keepdims in (None, 1), bool(last))
    check_node(op, [x], want, opset=13, **attrs)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_long_rows_with_spread_values(op, last):
    """Rows longer than the vector width, where the extreme sits anywhere."""
    x = random_array(np.random.default_rng(0), (7, 1000), np.float32, -1e3, 1e3)
    for axis in (0, 1, -1):
        want = reference(op, x, axis, True, bool(last))
        check_node(op, [x], want, opset=12, axis=axis, select_last_index=last)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_nan_wins_as_in_numpy(op, last):
    x = np.array(
        [[1, np.nan, 5, np.nan], [3, 7, 7, 2], [np.nan] * 4, [-np.inf, np.inf, -np.inf, np.inf]],
        np.float32,
    )
    for axis in (0, 1):
        want = reference(op, x, axis, False, bool(last))
        check_node(op, [x], want, opset=12, axis=axis, keepdims=0, select_last_index=last)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_opset_11_defaults(op):
    """Before opset 12 there is no select_last_index: axis 0, keepdims 1, first index."""
    x = random_array(np.random.default_rng(1), (5, 3, 17), np.int32, 0, 3)
    check_node(op, [x], reference(op, x, 0, True, False), opset=11)


def test_float16():
    x = random_array(np.random.default_rng(2), (3, 33), np.float16)
    check_node("ArgMax", [x], reference("ArgMax", x, 1, False, False), axis=1, keepdims=0)


def test_axis_out_of_range_is_refused():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ModelError, match=r"ArgMax node .*'axis' 2 is out of range"):
        run_node("ArgMax", [x], [np.zeros((3, 1), np.int64)], axis=2)


def test_empty_axis_is_refused():
    x = np.zeros((3, 0), np.float32)
    with pytest.raises(LoweringError, match="empty"):
        run_node("ArgMin", [x], [np.zeros((3, 1), np.int64)], axis=1)


def test_bool_is_refused():
    x = np.zeros((3, 2), np.bool_)
    with pytest.raises(LoweringError, match="bool"):
        run_node("ArgMax", [x], [np.zeros((1, 2), np.int64)])
