"""Movement lowerings (polyonnx/krnl/ops/movement.py) against numpy: Concat, Split, Slice,
Transpose, Expand, Tile, DepthToSpace and SpaceToDepth."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import PolyonnxError
from tests.helpers import (
    axis_of,
    broadcast_shapes,
    check_node,
    const,
    fast,
    random_array,
    run_node,
    seeds,
    shapes,
)

NEWEST = onnx.defs.onnx_opset_version()
DTYPES = (np.float32, np.int64, np.int8, np.bool_, np.float64)


# ---- Concat --------------------------------------------------------------------------


@fast(20)
@given(
    shape=shapes(1, 4, max_size=5000),
    data=st.data(),
    seed=seeds,
    dtype=st.sampled_from(DTYPES),
)
def test_concat_matches_numpy(shape, data, seed, dtype):
    rng = np.random.default_rng(seed)
    axis = data.draw(axis_of(len(shape)))
    sizes = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, 7, 17]), min_size=1, max_size=4))
    if not any(sizes):
        sizes[0] = 1
    parts = []
    for size in sizes:
        part_shape = list(shape)
        part_shape[axis] = size
        parts.append(random_array(rng, part_shape, dtype, -50, 50))
    check_node("Concat", parts, np.concatenate(parts, axis=axis), axis=axis)


def test_concat_of_a_constant_and_an_input():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.full((2, 2), 7, np.float32)
    check_node("Concat", [x, const(w), x], np.concatenate([x, w, x], 1), axis=1)


# ---- Split ---------------------------------------------------------------------------


@fast(15)
@given(shape=shapes(1, 3, max_size=5000), data=st.data(), seed=seeds)
def test_split_with_given_sizes_matches_numpy(shape, data, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(axis_of(len(shape)))
    n = shape[axis]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=3)))
    sizes = np.diff([0, *cuts, n]).astype(np.int64)
    x = random_array(rng, shape)
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    opset = data.draw(st.sampled_from([11, 13, 18]))
    if opset < 13:
        check_node("Split", [x], want, axis=axis, split=list(sizes), opset=opset)
    else:
        check_node("Split", [x, const(sizes)], want, axis=axis, opset=opset)


@pytest.mark.parametrize("n, parts", [(7, 3), (6, 3), (5, 4), (17, 2), (3, 3)])
def test_split_num_outputs_gives_a_shorter_last_part(n, parts):
    x = np.arange(n * 2, dtype=np.int32).reshape(2, n)
    chunk = -(-n // parts)
    want = [x[:, i * chunk : (i + 1) * chunk] for i in range(parts)]
    check_node("Split", [x], want, axis=1, num_outputs=parts, opset=18)


def test_split_into_equal_parts_by_default():
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    check_node("Split", [x], list(np.split(x, 3)), opset=13)
    check_node("Split", [x], list(np.split(x, 2)), opset=11)


def test_split_sizes_that_do_not_add_up_are_refused():
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(PolyonnxError, match="split"):
        run_node("Split", [x, const(np.array([2, 2]))], [x[:, :2], x[:, 2:4]], axis=1, opset=13)


# ---- Slice ---------------------------------------------------------------------------

bound = st.one_of(st.integers(-40, 40), st.sampled_from([2**63 - 1, -(2**63)]))


@fast(30)
@given(shape=shapes(1, 4, max_size=5000), data=st.data(), seed=seeds)
def test_slice_matches_numpy_slicing(shape, data, seed):
    rng = np.random.default_rng(seed)
    rank = len(shape)
    axes = data.draw(
        st.lists(
            st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank
        )
    )
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2, -5])) for _ in axes]
    x = random_array(rng, shape)
    index = [slice(None)] * rank
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        index[a % rank] = slice(b, e, s)
    args = [x, *(const(np.array(v, np.int64)) for v in (starts, ends, axes, steps))]
    check_node("Slice", args, x[tuple(index)], opset=13)


def test_slice_defaults_and_attribute_form():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    check_node("Slice", [x, const([1, -3]), const([3, 100])], x[1:3, -3:100], opset=13)
    check_node("Slice", [x], x[:, 1:3], starts=[1], ends=[3], axes=[1], opset=9)
    check_node("Slice", [x], x[1:, :-1], starts=[1, 0], ends=[1000, -1], opset=9)


def test_slice_starts_given_as_a_graph_input_are_specialised_on():
    x = np.arange(20, dtype=np.int32).reshape(4, 5)
    starts, ends = np.array([1], np.int64), np.array([-1], np.int64)
    check_node("Slice", [x, starts, ends, const([1])], x[:, 1:-1], opset=13)


def test_slice_to_nothing_gives_an_empty_tensor():
    x = np.arange(10, dtype=np.float32)
    check_node("Slice", [x, const([5]), const([2])], x[5:2], opset=13)


def test_slice_step_zero_is_refused():
    x = np.zeros(5, np.float32)
    with pytest.raises(PolyonnxError):
        run_node("Slice", [x, const([0]), const([3]), const([0]), const([0])], [x], opset=13)


# ---- Transpose and Expand ------------------------------------------------------------


@fast(20)
@given(shape=shapes(0, 5, max_size=5000), data=st.data(), seed=seeds, dtype=st.sampled_from(DTYPES))
def test_transpose_matches_numpy(shape, data, seed, dtype):
    x = random_array(np.random.default_rng(seed), shape, dtype, -50, 50)
    perm = data.draw(st.permutations(range(len(shape))))
    if shape and data.draw(st.booleans()):
        check_node("Transpose", [x], np.transpose(x, perm), perm=list(perm))
    else:
        check_node("Transpose", [x], np.transpose(x))


@fast(20)
@given(pair=broadcast_shapes(2, 0, 4), seed=seeds)
def test_expand_matches_numpy_broadcasting(pair, seed):
    small, target = pair
    x = random_array(np.random.default_rng(seed), small)
    want = x * np.ones(target, np.float32)
    check_node("Expand", [x, const(np.array(target, np.int64))], want)


def test_expand_to_a_smaller_rank_keeps_the_input_shape():
    x = np.arange(6, dtype=np.int64).reshape(2, 3, 1)
    check_node("Expand", [x, const([1, 4])], np.broadcast_to(x, (2, 3, 4)))


def test_expand_to_an_incompatible_shape_is_refused():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(PolyonnxError):
        run_node("Expand", [x, const([4, 3, 5])], [np.zeros((4, 3, 5), np.float32)])


# ---- Tile ----------------------------------------------------------------------------


@fast(20)
@given(shape=shapes(1, 4, max_size=2000), data=st.data(), seed=seeds)
def test_tile_matches_numpy(shape, data, seed):
    x = random_array(np.random.default_rng(seed), shape, np.int32, -50, 50)
    repeats = data.draw(
        st.lists(st.sampled_from([0, 1, 1, 2, 3]), min_size=len(shape), max_size=len(shape))
    )
    check_node("Tile", [x, const(np.array(repeats, np.int64))], np.tile(x, repeats))


def test_tile_with_wrong_repeats_length_is_refused():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(PolyonnxError):
        run_node("Tile", [x, const([2])], [np.zeros((4, 3), np.float32)])


# ---- DepthToSpace and SpaceToDepth ---------------------------------------------------


def _depth_to_space(x, bs, mode):
    b, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(b, bs, bs, c // bs**2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(b, c // bs**2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(b, c // bs**2, h * bs, w * bs)


@fast(15)
@given(
    bs=st.sampled_from([1, 2, 3]),
    c=st.sampled_from([1, 2, 5]),
    hw=st.tuples(st.sampled_from([1, 2, 7]), st.sampled_from([1, 3, 17])),
    mode=st.sampled_from(["DCR", "CRD"]),
    seed=seeds,
)
def test_depth_to_space_and_back(bs, c, hw, mode, seed):
    x = random_array(np.random.default_rng(seed), (2, c * bs * bs, *hw))
    y = _depth_to_space(x, bs, mode)
    check_node("DepthToSpace", [x], y, blocksize=bs, mode=mode, opset=13)
    check_node("SpaceToDepth", [y], x, blocksize=bs, mode=mode, opset=NEWEST)


def test_space_to_depth_before_modes_is_dcr():
    x = np.arange(2 * 4 * 6, dtype=np.float32).reshape(1, 2, 4, 6)
    want = x.reshape(1, 2, 2, 2, 3, 2).transpose(0, 3, 5, 1, 2, 4).reshape(1, 8, 2, 3)
    check_node("SpaceToDepth", [x], want, blocksize=2, opset=13)


def test_depth_to_space_with_indivisible_depth_is_refused():
    x = np.zeros((1, 6, 2, 2), np.float32)
    with pytest.raises(PolyonnxError):
        run_node("DepthToSpace", [x], [np.zeros((1, 1, 4, 4), np.float32)], blocksize=2)
