"""Gather, GatherElements and GatherND against numpy (GatherND: onnx's reference), with
negative indices; a bad index is an error (more in tests/runtime/test_run_checks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import RunError
from tests.helpers import (
    axis_of,
    check_node,
    fast,
    node_model,
    random_array,
    run_node,
    seeds,
    shapes,
)


@fast(20)
@given(shape=shapes(1, 3), index_shape=shapes(0, 2), data=st.data(), seed=seeds)
def test_gather_matches_numpy_take(shape, index_shape, data, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(axis_of(len(shape)))
    n = shape[axis]
    x = random_array(rng, shape)
    idx = rng.integers(-n, n, size=index_shape).astype(np.int64)
    check_node("Gather", [x, idx], np.take(x, idx, axis=axis), axis=axis)


@fast(15)
@given(shape=shapes(1, 3), data=st.data(), seed=seeds)
def test_gather_elements_matches_take_along_axis(shape, data, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(axis_of(len(shape)))
    x = random_array(rng, shape, np.int32, -50, 50)
    out_shape = list(shape)
    out_shape[axis] = data.draw(st.sampled_from([1, 2, 5]))
    idx = rng.integers(-shape[axis], shape[axis], size=out_shape).astype(np.int32)
    want = np.take_along_axis(x, np.where(idx < 0, idx + shape[axis], idx), axis=axis)
    check_node("GatherElements", [x, idx], want, axis=axis)


def test_an_out_of_range_index_is_a_run_error_naming_node_index_and_range():
    x = np.arange(5, dtype=np.float32)
    with pytest.raises(
        RunError, match=r"'gather_node' \(Gather\): index 7 is out of range \[-5, 4\]"
    ):
        run_node("Gather", [x, np.array([7, 1, 2], np.int64)], [x[:3]])


def gather_nd_reference(x: np.ndarray, idx: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND, by onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    rank = idx.ndim - 1 + x.ndim - batch_dims - idx.shape[-1]
    model, feed = node_model("GatherND", [x, idx], [(x.dtype, rank)], batch_dims=batch_dims)
    return ReferenceEvaluator(model).run(None, feed)[0]


@fast(25)
@given(shape=shapes(1, 4), data=st.data(), seed=seeds)
def test_gather_nd_matches_the_reference(shape, data, seed):
    """Every batch_dims and index depth, negative indices, index tensors of rank 1 to 3."""
    rng = np.random.default_rng(seed)
    batch = data.draw(st.integers(0, len(shape) - 1), label="batch_dims")
    depth = data.draw(st.integers(1, len(shape) - batch), label="k")
    extra = data.draw(st.lists(st.sampled_from([1, 2, 3, 5]), max_size=2), label="extra")
    lead = [*shape[:batch], *extra]
    columns = [rng.integers(-shape[batch + c], shape[batch + c], lead) for c in range(depth)]
    idx = np.stack(columns, -1).astype(data.draw(st.sampled_from([np.int64, np.int32])))
    x = random_array(rng, shape)
    want = gather_nd_reference(x, idx.astype(np.int64), batch)
    check_node("GatherND", [x, idx.astype(np.int64)], want, batch_dims=batch)


def test_gather_nd_bad_index_names_the_node_and_axis():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 1], [2, 4]], np.int64)
    with pytest.raises(RunError, match=r"\(GatherND\): index 4 is out of range of axis 1 of 'x0'"):
        run_node("GatherND", [x, idx], [x[0, :2]])
