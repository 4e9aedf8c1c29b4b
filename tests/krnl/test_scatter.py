"""ScatterElements, ScatterND and Scatter (polyonnx/krnl/ops/scatter.py) against numpy
loops that apply the updates one after another, as the ONNX reference does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import LoweringError
from tests.helpers import axis_of, check_node, fast, random_array, run_node, seeds, shapes

APPLY = {
    "none": lambda old, new: new,
    "add": lambda old, new: old + new,
    "mul": lambda old, new: old * new,
    "max": np.maximum,
    "min": np.minimum,
}
BOOL_APPLY = {"add": np.logical_or, "mul": np.logical_and}


def combine(reduction: str, dtype):
    if dtype == np.bool_ and reduction in BOOL_APPLY:
        return BOOL_APPLY[reduction]
    return APPLY[reduction]


def scatter_elements(data, indices, updates, axis, reduction="none"):
    out = data.copy()
    fold = combine(reduction, data.dtype)
    for pos in np.ndindex(*indices.shape):
        target = list(pos)
        target[axis] = indices[pos] % data.shape[axis]
        out[tuple(target)] = fold(out[tuple(target)], updates[pos])
    return out


def scatter_nd(data, indices, updates, reduction="none"):
    out = data.copy()
    fold = combine(reduction, data.dtype)
    for pos in np.ndindex(*indices.shape[:-1]):
        target = tuple(int(i) % n for i, n in zip(indices[pos], data.shape, strict=False))
        out[target] = fold(out[target], updates[pos])
    return out


def values(rng, shape, dtype, reduction):
    if dtype == np.bool_:
        return random_array(rng, shape, dtype)
    if reduction == "mul":  # products of a few factors near 1 (or small integers)
        if np.issubdtype(dtype, np.floating):
            return rng.uniform(0.5, 1.5, size=shape).astype(dtype)
        return random_array(rng, shape, dtype, -2, 2)
    return random_array(rng, shape, dtype, -20, 20)


def opset_for(reduction: str) -> int:
    return 18 if reduction in ("max", "min") else 16


DTYPES = st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.bool_])
REDUCTIONS = st.sampled_from(["none", "add", "mul", "max", "min"])


@fast(30)
@given(
    shape=shapes(1, 4, max_size=2_000),
    seed=seeds,
    data=st.data(),
    dtype=DTYPES,
    reduction=REDUCTIONS,
    index_dtype=st.sampled_from([np.int32, np.int64]),
)
def test_scatter_elements(shape, seed, data, dtype, reduction, index_dtype):
    if dtype == np.bool_ and reduction in ("max", "min"):
        reduction = "none"
    rng = np.random.default_rng(seed)
    axis = data.draw(axis_of(len(shape)))
    a = axis % len(shape)
    index_shape = tuple(
        data.draw(st.integers(1, 2 * n if r == a else n)) for r, n in enumerate(shape)
    )
    x = values(rng, shape, dtype, reduction)
    n = shape[a]
    indices = rng.integers(-n, n, size=index_shape).astype(index_dtype)  # duplicates too
    updates = values(rng, index_shape, dtype, reduction)
    want = scatter_elements(x, indices, updates, a, reduction)
    attrs = {} if reduction == "none" and data.draw(st.booleans()) else {"reduction": reduction}
    check_node("ScatterElements", [x, indices, updates], want, axis=axis,
               tol={"rtol": 1e-5, "atol": 1e-5}, opset=opset_for(reduction), **attrs)  # fmt: skip


@fast(30)
@given(
    shape=shapes(1, 4, max_size=2_000),
    seed=seeds,
    data=st.data(),
    dtype=DTYPES,
    reduction=REDUCTIONS,
)
def test_scatter_nd(shape, seed, data, dtype, reduction):
    if dtype == np.bool_ and reduction in ("max", "min"):
        reduction = "none"
    rng = np.random.default_rng(seed)
    depth = data.draw(st.integers(1, len(shape)))
    tuples = tuple(data.draw(st.lists(st.integers(1, 6), min_size=0, max_size=2)))
    x = values(rng, shape, dtype, reduction)
    heads = np.array(shape[:depth])
    indices = rng.integers(-heads, heads, size=(*tuples, depth)).astype(np.int64)
    updates = values(rng, (*tuples, *shape[depth:]), dtype, reduction)
    want = scatter_nd(x, indices, updates, reduction)
    check_node("ScatterND", [x, indices, updates], want, reduction=reduction,
               tol={"rtol": 1e-5, "atol": 1e-5}, opset=opset_for(reduction))  # fmt: skip


def test_scatter_nd_duplicates_last_wins():
    """Without a reduction the last of several updates to one slice wins."""
    x = np.zeros((4, 3), np.float32)
    indices = np.array([[1], [3], [1], [-3]], np.int64)
    updates = np.arange(12, dtype=np.float32).reshape(4, 3)
    check_node("ScatterND", [x, indices, updates], scatter_nd(x, indices, updates), opset=13)


def test_scatter_nd_whole_tensor():
    """An empty index tuple addresses the whole tensor: the last update replaces it."""
    x = np.zeros((2, 3), np.float32)
    indices = np.zeros((2, 0), np.int64)
    updates = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    check_node("ScatterND", [x, indices, updates], updates[1], opset=13)


def test_scatter_elements_duplicates_and_old_scatter():
    x = np.zeros((3, 5), np.float32)
    indices = np.array([[1, 1, -1], [0, 4, 4]], np.int64)
    updates = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    want = scatter_elements(x, indices, updates, 1)
    check_node("ScatterElements", [x, indices, updates], want, axis=1, opset=11)
    want = scatter_elements(x, indices % 5, updates, 1)
    check_node("Scatter", [x, indices % 5, updates], want, axis=1, opset=9)


def test_scatter_elements_float16_add():
    rng = np.random.default_rng(7)
    x = random_array(rng, (5, 6), np.float16, -1, 1)
    indices = rng.integers(0, 5, size=(9, 6)).astype(np.int64)
    updates = random_array(rng, (9, 6), np.float16, -1, 1)
    want = scatter_elements(x.astype(np.float32), indices, updates.astype(np.float32), 0, "add")
    check_node("ScatterElements", [x, indices, updates], want.astype(np.float16), axis=0,
               reduction="add", tol={"rtol": 1e-2, "atol": 1e-2}, opset=16)  # fmt: skip


def test_scatter_refuses_mismatched_shapes():
    x = np.zeros((3, 4), np.float32)
    indices = np.zeros((2, 2), np.int64)
    with pytest.raises(LoweringError, match="the shape of updates"):
        run_node("ScatterElements", [x, indices, np.zeros((2, 3), np.float32)], [x], opset=16)
    with pytest.raises(LoweringError, match="unknown reduction"):
        run_node("ScatterND", [x, indices, np.zeros((2,), np.float32)], [x], opset=16,
                 reduction="sum")  # fmt: skip
