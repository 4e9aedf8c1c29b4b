"""Range, ConstantOfShape, EyeLike, Trilu and OneHot (polyonnx/krnl/ops/generate.py)
against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

from polyonnx.errors import PolyonnxError
from tests.helpers import check_node, const, fast, random_array, run_node, seeds, shapes

# ---- Range ---------------------------------------------------------------------------


@fast(20)
@given(
    start=st.integers(-20, 20),
    limit=st.integers(-20, 20),
    delta=st.sampled_from([1, 2, 3, -1, -4]),
    dtype=st.sampled_from([np.int32, np.int64, np.int16]),
)
def test_integer_range_matches_arange(start, limit, delta, dtype):
    args = [np.array(v, dtype) for v in (start, limit, delta)]
    check_node("Range", args, np.arange(start, limit, delta, dtype=dtype), opset=11)


@pytest.mark.parametrize(
    "start, limit, delta", [(0.5, 3.2, 0.3), (10.0, -2.0, -1.5), (1.0, 1.0, 1.0), (-1.0, 1.0, 0.1)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_range_matches_arange(start, limit, delta, dtype):
    args = [np.array(v, dtype) for v in (start, limit, delta)]
    want = np.arange(*args, dtype=np.float64).astype(dtype)  # as onnx.reference does
    args = [const(a) for a in args]
    check_node("Range", args, want, opset=11)


def test_range_with_zero_delta_is_refused():
    args = [const(np.array(v, np.int64)) for v in (0, 5, 0)]
    with pytest.raises(PolyonnxError):
        run_node("Range", args, [np.arange(1)], opset=11)


# ---- ConstantOfShape -----------------------------------------------------------------


@pytest.mark.parametrize("shape", [[], [0], [3], [2, 0, 4], [5, 17, 3]])
@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([-7], np.int32)])
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": helper.make_tensor("v", _type(value), [1], value)}
    fill = 0.0 if value is None else value[0]
    dtype = np.float32 if value is None else value.dtype
    check_node("ConstantOfShape", [np.array(shape, np.int64)], np.full(shape, fill, dtype), **attrs)


def _type(value: np.ndarray) -> int:
    return {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}[
        value.dtype
    ]


# ---- EyeLike -------------------------------------------------------------------------


@fast(20)
@given(shape=shapes(2, 2), k=st.integers(-40, 40), dtype=st.sampled_from([None, 1, 6, 7, 9, 11]))
def test_eye_like_matches_numpy_eye(shape, k, dtype):
    x = np.zeros(shape, np.int32)
    types = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 11: np.float64}
    out = np.int32 if dtype is None else types[dtype]
    attrs = {} if dtype is None else {"dtype": dtype}
    check_node("EyeLike", [x], np.eye(*shape, k=k, dtype=out), k=k, **attrs)


# ---- Trilu ---------------------------------------------------------------------------


@fast(25)
@given(
    shape=shapes(2, 4, max_size=5000),
    k=st.one_of(st.none(), st.integers(-40, 40)),
    upper=st.booleans(),
    seed=seeds,
)
def test_trilu_matches_numpy(shape, k, upper, seed):
    x = random_array(np.random.default_rng(seed), shape)
    kk = 0 if k is None else k
    want = np.triu(x, kk) if upper else np.tril(x, kk)
    args = [x] if k is None else [x, const(np.array(k, np.int64))]
    check_node("Trilu", args, want, upper=int(upper), opset=14)


def test_trilu_k_from_a_graph_input_is_specialised_on():
    x = np.arange(20, dtype=np.int64).reshape(4, 5)
    check_node("Trilu", [x, np.array(-1, np.int64)], np.tril(x, -1), upper=0, opset=14)


# ---- OneHot --------------------------------------------------------------------------


def one_hot(indices, depth, axis, off, on):
    wrapped = np.where(indices < 0, indices + depth, indices).astype(np.int64)
    hit = np.expand_dims(wrapped, axis) == np.arange(depth).reshape(
        [depth if r == axis % (indices.ndim + 1) else 1 for r in range(indices.ndim + 1)]
    )
    return np.where(hit, on, off)


@fast(20)
@given(
    shape=shapes(0, 3, max_size=2000),
    depth=st.sampled_from([1, 3, 10, 17]),
    data=st.data(),
    seed=seeds,
    index_type=st.sampled_from([np.int64, np.int32, np.float32]),
)
def test_one_hot_matches_numpy(shape, depth, data, seed, index_type):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    indices = rng.integers(-depth - 2, depth + 2, size=shape).astype(index_type)
    values = np.array([-1.5, 4.0], np.float32)
    want = one_hot(indices, depth, axis, values[0], values[1]).astype(np.float32)
    check_node("OneHot", [indices, const(np.array(depth)), values], want, axis=axis, opset=11)


def test_one_hot_with_integer_values_and_default_axis():
    indices = np.array([[0, 2], [-1, 5]], np.int64)
    values = np.array([0, 9], np.int32)
    want = one_hot(indices, 4, -1, 0, 9).astype(np.int32)
    check_node(
        "OneHot", [indices, const(np.array([4.0], np.float32)), const(values)], want, opset=11
    )


def test_one_hot_values_must_be_a_pair():
    indices = np.array([0, 1], np.int64)
    with pytest.raises(PolyonnxError):
        run_node(
            "OneHot",
            [indices, const(np.array(3)), np.zeros(3, np.float32)],
            [np.zeros((2, 3), np.float32)],
            opset=11,
        )
