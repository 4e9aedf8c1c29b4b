"""CumProd (polyonnx/krnl/ops/scan.py) against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import LoweringError
from tests.helpers import (
    axis_of,
    check_node,
    const,
    fast,
    random_array,
    run_node,
    seeds,
    shapes,
)

OPSET = 26
PROD_TOL = {"rtol": 2e-5, "atol": 1e-6}


def cumprod(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    y = np.flip(x, axis) if reverse else x
    y = np.cumprod(y, axis=axis, dtype=x.dtype)
    if exclusive:
        y = np.roll(y, 1, axis=axis)
        y[(slice(None),) * (axis % x.ndim) + (0,)] = 1
    return np.flip(y, axis) if reverse else y


def values(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Factors that keep long products finite: near 1 for floats, small for integers
    (integer products wrap around, as in numpy)."""
    if np.issubdtype(dtype, np.floating):
        signs = np.where(rng.random(shape) < 0.2, -1, 1)
        return (rng.uniform(0.8, 1.25, size=shape) * signs).astype(dtype)
    low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -3
    return random_array(rng, shape, dtype, low, 3)


@fast(25)
@given(
    shape=shapes(1, 4, max_size=3_000),
    seed=seeds,
    data=st.data(),
    exclusive=st.sampled_from([None, 0, 1]),
    reverse=st.sampled_from([None, 0, 1]),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint32]),
    axis_dtype=st.sampled_from([np.int32, np.int64]),
)
def test_cumprod_matches_numpy(shape, seed, data, exclusive, reverse, dtype, axis_dtype):
    axis = data.draw(axis_of(len(shape)))
    x = values(np.random.default_rng(seed), shape, dtype)
    attrs = {k: v for k, v in (("exclusive", exclusive), ("reverse", reverse)) if v is not None}
    want = cumprod(x, axis, bool(exclusive), bool(reverse))
    check_node(
        "CumProd", [x, const(np.array(axis, axis_dtype))], want, tol=PROD_TOL, opset=OPSET, **attrs
    )


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_long_axis(exclusive, reverse):
    """A long axis, innermost and outermost; a zero in a line zeroes what follows it."""
    rng = np.random.default_rng(0)
    x = values(rng, (200, 7), np.float32)
    x[50, 3] = 0
    for axis in (0, 1):
        want = cumprod(x, axis, bool(exclusive), bool(reverse))
        check_node("CumProd", [x, const(np.array([axis]))], want, tol={"rtol": 1e-4, "atol": 1e-6},
                   opset=OPSET, exclusive=exclusive, reverse=reverse)  # fmt: skip


def test_cumprod_axis_as_a_graph_input():
    """The axis is needed at compile time: the session compiles for its value."""
    x = values(np.random.default_rng(1), (4, 6), np.float32)
    check_node("CumProd", [x, np.array(-1, np.int64)], np.cumprod(x, axis=1), tol=PROD_TOL,
               opset=OPSET)  # fmt: skip


def test_cumprod_float16_and_empty():
    x = values(np.random.default_rng(2), (3, 9), np.float16)
    want = np.cumprod(x.astype(np.float32), axis=1).astype(np.float16)
    check_node("CumProd", [x, const(np.array(1))], want, tol={"rtol": 5e-3, "atol": 5e-3},
               opset=OPSET)  # fmt: skip
    empty = np.zeros((0, 4), np.float32)
    check_node("CumProd", [empty, const(np.array(1))], empty, opset=OPSET)


def test_cumprod_refuses_bad_axes():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(LoweringError, match="out of range"):
        run_node("CumProd", [x, const(np.array(2))], [x], opset=OPSET)
    with pytest.raises(LoweringError, match="scalar"):
        run_node("CumProd", [x, const(np.array([0, 1]))], [x], opset=OPSET)
