"""TopK (polyonnx/krnl/ops/topk.py) against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import ModelError
from tests.helpers import axis_of, check_node, const, fast, random_array, run_node, seeds, shapes


def topk(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """ONNX's order: larger (smaller) values first, ties by the smaller index, NaN is
    the largest value."""
    index = np.indices(x.shape)[axis]
    if largest:
        order = np.flip(np.lexsort((-index, x), axis=axis), axis=axis)
    else:
        order = np.lexsort((index, x), axis=axis)
    order = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, order, axis=axis), order.astype(np.int64)


@fast(30)
@given(
    shape=shapes(1, 4, max_size=4_000),
    seed=seeds,
    data=st.data(),
    largest=st.sampled_from([None, 0, 1]),
    sorted_=st.sampled_from([None, 0, 1]),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint8]),
    ties=st.booleans(),
)
def test_topk_matches_numpy(shape, seed, data, largest, sorted_, dtype, ties):
    rng = np.random.default_rng(seed)
    axis = data.draw(axis_of(len(shape)))
    n = shape[axis]
    k = data.draw(st.integers(0, n))
    x = random_array(rng, shape, dtype, 0, 3 if ties else 100)
    attrs = {k: v for k, v in (("largest", largest), ("sorted", sorted_)) if v is not None}
    want = topk(x, k, axis % len(shape), largest in (None, 1))
    check_node("TopK", [x, const(np.array([k], np.int64))], list(want), axis=axis, opset=11,
               **attrs)  # fmt: skip


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_nan_and_signed_zero(largest):
    """NaN sorts as the largest value; -0.0 and 0.0 tie and keep their order."""
    x = np.array([[1.0, np.nan, -0.0, 3.0, 0.0, np.nan, -np.inf, np.inf]], np.float32)
    want = topk(x, 8, 1, bool(largest))
    check_node("TopK", [x, const(np.array([8]))], list(want), largest=largest, opset=11)


def test_topk_long_axis_and_k_as_a_graph_input():
    """A long axis (not the last), and k given at run time: compiled for its value."""
    x = random_array(np.random.default_rng(3), (3, 500, 2), np.float32)
    want = topk(x, 17, 1, True)
    check_node("TopK", [x, np.array([17], np.int64)], list(want), axis=1, opset=11)


@pytest.mark.parametrize("opset", [9, 10])
def test_topk_older_opsets(opset):
    """k is an attribute before opset 10, an input from 10; both take the largest."""
    x = random_array(np.random.default_rng(4), (4, 9), np.float32)
    want = topk(x, 3, 1, True)
    if opset < 10:
        check_node("TopK", [x], list(want), k=3, opset=opset)
    else:
        check_node("TopK", [x, const(np.array([3]))], list(want), opset=opset)


def test_topk_float16():
    x = random_array(np.random.default_rng(5), (6, 20), np.float16, -2, 2)
    want = topk(x, 5, 1, False)
    check_node("TopK", [x, const(np.array([5]))], list(want), largest=0, opset=11)


def test_topk_refuses_k_larger_than_the_axis():
    x = np.zeros((3, 4), np.float32)
    empty = np.zeros((3, 5), np.float32), np.zeros((3, 5), np.int64)
    with pytest.raises(ModelError, match=r"TopK node .*k = 5 is larger than axis -1 of size 4"):
        run_node("TopK", [x, const(np.array([5]))], list(empty), opset=11)
