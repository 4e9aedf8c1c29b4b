"""Gather and GatherElements against numpy, with negative indices; a bad index is an error
(more in tests/runtime/test_run_checks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import RunError
from tests.helpers import axis_of, check_node, fast, random_array, run_node, seeds, shapes


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
