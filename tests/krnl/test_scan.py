"""CumSum and ReverseSequence (polyonnx/krnl/ops/scan.py) against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import ModelError
from tests.helpers import (
    FLOAT_TOL,
    axis_of,
    check_node,
    const,
    fast,
    random_array,
    run_node,
    seeds,
    shapes,
    sum_tol,
)


def cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    y = np.flip(x, axis) if reverse else x
    y = np.cumsum(y, axis=axis, dtype=x.dtype)
    if exclusive:
        y = np.roll(y, 1, axis=axis)
        y[(slice(None),) * (axis % x.ndim) + (0,)] = 0
    return np.flip(y, axis) if reverse else y


@fast(25)
@given(
    shape=shapes(1, 4, max_size=5_000),
    seed=seeds,
    data=st.data(),
    exclusive=st.sampled_from([None, 0, 1]),
    reverse=st.sampled_from([None, 0, 1]),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint32]),
    axis_dtype=st.sampled_from([np.int32, np.int64]),
)
def test_cumsum_matches_numpy(shape, seed, data, exclusive, reverse, dtype, axis_dtype):
    axis = data.draw(axis_of(len(shape)))
    x = random_array(np.random.default_rng(seed), shape, dtype, 0 if dtype == np.uint32 else -9, 9)
    attrs = {k: v for k, v in (("exclusive", exclusive), ("reverse", reverse)) if v is not None}
    want = cumsum(x, axis, bool(exclusive), bool(reverse))
    tol = sum_tol(shape[axis] * 4) if np.issubdtype(dtype, np.floating) else FLOAT_TOL
    check_node("CumSum", [x, const(np.array(axis, axis_dtype))], want, tol=tol, **attrs)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_long_axis(exclusive, reverse):
    """A long axis, with the axis both innermost and outermost."""
    x = random_array(np.random.default_rng(0), (300, 5), np.float32, -1, 1)
    for axis in (0, 1):
        want = cumsum(x, axis, bool(exclusive), bool(reverse))
        check_node("CumSum", [x, const(np.array([axis]))], want, tol=sum_tol(300),
                   exclusive=exclusive, reverse=reverse)  # fmt: skip


def test_cumsum_axis_as_a_graph_input():
    """The axis is needed at compile time: the session compiles for its value."""
    x = random_array(np.random.default_rng(1), (4, 6), np.float32)
    check_node("CumSum", [x, np.array(-1, np.int64)], np.cumsum(x, axis=1), tol=sum_tol(6))


def test_cumsum_float16():
    x = random_array(np.random.default_rng(2), (3, 17), np.float16, -1, 1)
    want = np.cumsum(x.astype(np.float32), axis=1).astype(np.float16)
    check_node("CumSum", [x, const(np.array(1))], want, tol={"rtol": 5e-3, "atol": 5e-3})


def test_cumsum_refuses_a_bad_axis():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ModelError, match=r"CumSum node .*'axis' 2 is out of range"):
        run_node("CumSum", [x, const(np.array(2))], [x])
    with pytest.raises(ModelError, match=r"CumSum node .*axis \[0, 1\] must be one value"):
        run_node("CumSum", [x, const(np.array([0, 1]))], [x])


# ---- ReverseSequence -----------------------------------------------------------------


def reverse_sequence(x: np.ndarray, lens: np.ndarray, batch_axis: int, time_axis: int):
    y = x.copy()
    for b, n in enumerate(lens):
        src = [slice(None)] * x.ndim
        src[batch_axis], src[time_axis] = b, slice(0, n)
        y[tuple(src)] = np.flip(x[tuple(src)], axis=0)  # the batch index drops its axis
    return y


@fast(20)
@given(
    shape=shapes(2, 4),
    seed=seeds,
    batch_first=st.booleans(),
    dtype=st.sampled_from([np.float32, np.int64, np.bool_]),
)
def test_reverse_sequence(shape, seed, batch_first, dtype):
    rng = np.random.default_rng(seed)
    batch_axis, time_axis = (0, 1) if batch_first else (1, 0)
    x = random_array(rng, shape, dtype, -50, 50)
    lens = rng.integers(1, shape[time_axis], size=shape[batch_axis], endpoint=True)
    want = reverse_sequence(x, lens, batch_axis, time_axis)
    check_node("ReverseSequence", [x, lens.astype(np.int64)], want, batch_axis=batch_axis,
               time_axis=time_axis)  # fmt: skip


def test_reverse_sequence_refuses_other_axes():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(
        ModelError, match=r"ReverseSequence node .*batch_axis = 1 and time_axis = 1"
    ):
        run_node("ReverseSequence", [x, np.ones(4, np.int64)], [x], batch_axis=1, time_axis=1)
