"""GridSample, AffineGrid, Col2Im and CenterCropPad (polyonnx/krnl/ops/sample.py).

GridSample is compared with the ONNX reference implementation (onnx.reference, an
independent per-pixel Python loop); the others with numpy written here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator

from polyonnx.errors import LoweringError
from tests.helpers import check_node, const, fast, node_model, random_array, run_node, seeds

GRID_TOL = {"rtol": 1e-4, "atol": 1e-5}


def reference(op_type: str, args, outputs, opset: int, **attrs) -> list[np.ndarray]:
    model, feed = node_model(op_type, args, outputs, opset=opset, **attrs)
    return ReferenceEvaluator(model).run(None, feed)


# ---- GridSample ----------------------------------------------------------------------------


def grid_values(rng, shape, dtype, spread: float) -> np.ndarray:
    """Uniform in [-spread, spread], with some points exactly on pixel centres and
    borders (-1, 0, 1)."""
    grid = rng.uniform(-spread, spread, size=shape)
    exact = rng.random(shape) < 0.15
    grid[exact] = rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], size=int(exact.sum()))
    return grid.astype(dtype)


@fast(30)
@given(
    seed=seeds,
    data=st.data(),
    mode=st.sampled_from(["nearest", "linear", "cubic"]),
    padding=st.sampled_from(["zeros", "border", "reflection"]),
    align=st.sampled_from([0, 1]),
    spatial=st.sampled_from([1, 2, 2, 3]),
)
def test_grid_sample_matches_the_reference(seed, data, mode, padding, align, spatial):
    rng = np.random.default_rng(seed)
    if mode == "cubic" and spatial == 3:
        spatial = 2
    small = st.sampled_from([1, 2, 3, 5] if spatial == 3 else [1, 2, 3, 4, 7])
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    sizes = [data.draw(small) for _ in range(spatial)]
    if padding == "reflection" and align:  # the reference divides by size - 1
        sizes = [max(s, 2) for s in sizes]
    points = [data.draw(small) for _ in range(spatial)]
    x = random_array(rng, (n, c, *sizes), np.float32)
    grid = grid_values(
        rng, (n, *points, spatial), np.float32, data.draw(st.sampled_from([1.0, 2.5]))
    )
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    (want,) = reference("GridSample", [x, grid], [(np.float32, spatial + 2)], 20, **attrs)
    check_node("GridSample", [x, grid], want, tol=GRID_TOL, opset=20, **attrs)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_grid_sample_opset16_names(mode):
    """Opset 16 spells the modes bilinear and bicubic, and bilinear is the default."""
    rng = np.random.default_rng(1)
    x = random_array(rng, (1, 2, 6, 5), np.float32)
    grid = grid_values(rng, (1, 4, 3, 2), np.float32, 1.2)
    new_name = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    (want,) = reference("GridSample", [x, grid], [(np.float32, 4)], 20, mode=new_name)
    check_node("GridSample", [x, grid], want, tol=GRID_TOL, opset=16, mode=mode)
    if mode == "bilinear":
        check_node("GridSample", [x, grid], want, tol=GRID_TOL, opset=16)


def test_grid_sample_far_away_and_nan_coordinates():
    """Coordinates far outside the image (and infinities) read zeros, not memory."""
    x = random_array(np.random.default_rng(2), (1, 1, 4, 4), np.float32)
    grid = np.array([[[[1e30, 0.0], [-1e30, 0.5], [np.inf, -np.inf], [3.0, -7.0]]]], np.float32)
    check_node("GridSample", [x, grid], np.zeros((1, 1, 1, 4), np.float32), opset=20,
               mode="nearest")  # fmt: skip


def test_grid_sample_integer_input_nearest_and_float64():
    rng = np.random.default_rng(3)
    x = random_array(rng, (2, 3, 5, 4), np.int64, -50, 50)
    grid = grid_values(rng, (2, 3, 3, 2), np.float32, 1.3)
    (want,) = reference("GridSample", [x, grid], [(np.int64, 4)], 20, mode="nearest")
    check_node("GridSample", [x, grid], want, opset=20, mode="nearest")
    x64 = random_array(rng, (1, 2, 5, 4), np.float64)
    grid64 = grid_values(rng, (1, 3, 3, 2), np.float64, 1.3)
    (want,) = reference("GridSample", [x64, grid64], [(np.float64, 4)], 20, padding_mode="border")
    check_node("GridSample", [x64, grid64], want, opset=20, padding_mode="border")


def test_grid_sample_refuses_a_mismatched_grid():
    x = np.zeros((1, 1, 4, 4), np.float32)
    grid = np.zeros((1, 2, 2, 3), np.float32)
    with pytest.raises(LoweringError, match="do not fit"):
        run_node("GridSample", [x, grid], [np.zeros((1, 1, 2, 2), np.float32)], opset=20)


# ---- AffineGrid ----------------------------------------------------------------------------


def affine_grid(theta: np.ndarray, size: list[int], align: bool) -> np.ndarray:
    points = size[2:]
    rank = len(points)
    axes = []
    for length in points:
        if align:
            axes.append(np.linspace(-1, 1, length) if length > 1 else np.array([-1.0]))
        else:
            axes.append((2 * np.arange(length) + 1) / length - 1)
    mesh = np.meshgrid(*axes, indexing="ij")  # mesh[d] varies along spatial dim d
    base = np.stack([*mesh[::-1], np.ones(points)], axis=-1)  # (x, y[, z], 1)
    grid = np.einsum("nkm,...m->n...k", theta.astype(np.float64), base)
    assert grid.shape[-1] == rank
    return grid.astype(theta.dtype)


@fast(15)
@given(
    seed=seeds,
    data=st.data(),
    rank=st.sampled_from([2, 3]),
    align=st.sampled_from([0, 1]),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_affine_grid(seed, data, rank, align, dtype):
    size = [
        data.draw(st.integers(1, 3)),
        2,
        *(data.draw(st.sampled_from([1, 2, 5, 16])) for _ in range(rank)),
    ]
    theta = random_array(np.random.default_rng(seed), (size[0], rank, rank + 1), dtype, -2, 2)
    want = affine_grid(theta, size, bool(align))
    check_node("AffineGrid", [theta, const(np.array(size, np.int64))], want, opset=20,
               align_corners=align)  # fmt: skip


# ---- Col2Im --------------------------------------------------------------------------------


def col2im(x, image, block, dilations, pads, strides):
    rank = len(image)
    blocks = [
        (image[d] + pads[d] + pads[rank + d] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
        for d in range(rank)
    ]
    n, cols, _ = x.shape
    channels = cols // int(np.prod(block))
    out = np.zeros((n, channels, *image), x.dtype)
    cells = x.reshape(n, channels, *block, *blocks)
    for k in np.ndindex(*block):
        for b in np.ndindex(*blocks):
            y = [b[d] * strides[d] - pads[d] + k[d] * dilations[d] for d in range(rank)]
            if all(0 <= y[d] < image[d] for d in range(rank)):
                out[(slice(None), slice(None), *y)] += cells[(slice(None), slice(None), *k, *b)]
    return out


@fast(20)
@given(seed=seeds, data=st.data(), rank=st.sampled_from([1, 2, 2, 3]))
def test_col2im(seed, data, rank):
    small = st.integers(1, 3)
    block = [data.draw(small) for _ in range(rank)]
    dilations = [data.draw(st.integers(1, 2)) for _ in range(rank)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    pads = [data.draw(st.integers(0, 2)) for _ in range(2 * rank)]
    image = [
        data.draw(
            st.integers(max(1, dilations[d] * (block[d] - 1) + 1 - pads[d] - pads[rank + d]), 8)
        )
        for d in range(rank)
    ]
    blocks = [
        (image[d] + pads[d] + pads[rank + d] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
        for d in range(rank)
    ]
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    x = random_array(
        np.random.default_rng(seed), (n, c * int(np.prod(block)), int(np.prod(blocks)))
    )
    want = col2im(x, image, block, dilations, pads, strides)
    check_node("Col2Im", [x, const(np.array(image)), const(np.array(block))], want, opset=18,
               dilations=dilations, pads=pads, strides=strides)  # fmt: skip


def test_col2im_refuses_a_wrong_column_count():
    x = np.zeros((1, 4, 5), np.float32)
    with pytest.raises(LoweringError, match="block positions"):
        run_node("Col2Im", [x, const(np.array([3, 3])), const(np.array([2, 2]))],
                 [np.zeros((1, 1, 3, 3), np.float32)], opset=18)  # fmt: skip


# ---- CenterCropPad -------------------------------------------------------------------------


def center_crop_pad(x: np.ndarray, target: list[int], axes: list[int]) -> np.ndarray:
    out = x
    for a, size in zip(axes, target, strict=True):
        dim = out.shape[a]
        if size < dim:
            start = (dim - size) // 2
            out = np.take(out, np.arange(start, start + size), axis=a)
        elif size > dim:
            start = (size - dim) // 2
            widths = [(0, 0)] * out.ndim
            widths[a] = (start, size - dim - start)
            out = np.pad(out, widths)
    return out


@fast(25)
@given(
    seed=seeds,
    data=st.data(),
    shape=st.lists(st.sampled_from([1, 2, 3, 6, 7]), min_size=1, max_size=4),
    dtype=st.sampled_from([np.float32, np.int64, np.bool_]),
)
def test_center_crop_pad(seed, data, shape, dtype):
    rank = len(shape)
    chosen = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    axes = [a - rank if data.draw(st.booleans()) else a for a in chosen]
    target = [data.draw(st.integers(1, 9)) for _ in axes]
    x = random_array(np.random.default_rng(seed), shape, dtype)
    want = center_crop_pad(x, target, [a % rank for a in axes])
    attrs = {"axes": axes} if axes != list(range(rank)) or data.draw(st.booleans()) else {}
    check_node("CenterCropPad", [x, const(np.array(target, np.int64))], want, opset=18, **attrs)
