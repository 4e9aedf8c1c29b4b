"""Pool lowerings (polyonnx/krnl/ops/pool.py): MaxPool (+ Indices), AveragePool, LpPool and
the global pools, in 1-D, 2-D and 3-D with pads, auto_pad, strides, dilations and
ceil_mode, against a float64 numpy reference that pads explicitly (NaN marks a position
that is not part of the window)."""

from __future__ import annotations

import itertools

import islpy as isl
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx
from polyonnx.frontend import load_graph
from polyonnx.krnl.lower import lower
from polyonnx.runtime.compiled import compile_program
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.heuristics.stencil import stencil_schedule
from polyonnx.schedule.tree import VECTORIZE
from tests.helpers import (
    MATH_TOL,
    assert_matches,
    check_node,
    fast,
    node_model,
    random_array,
    run_node,
    seeds,
    shapes,
    sum_tol,
)

# ---- reference ---------------------------------------------------------------------------


def geometry(spatial, kernel, strides, dilations, mode, pads, ceil_mode):
    """(begins, ends, outs) per axis, as the ONNX spec gives them."""
    rank = len(spatial)
    begins, ends, outs = [], [], []
    for r in range(rank):
        size, k, s, d = spatial[r], kernel[r], strides[r], dilations[r]
        span = d * (k - 1) + 1
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
            total = max(0, (out - 1) * s + span - size)
            begin = total // 2 if mode == "SAME_UPPER" else total - total // 2
            end = total - begin
        else:
            begin, end = (pads[r], pads[rank + r]) if mode == "NOTSET" else (0, 0)
            room = size + begin + end - span
            out = (-(-room // s) if ceil_mode else room // s) + 1
            if ceil_mode and (out - 1) * s >= size + begin:
                out -= 1
        begins.append(begin)
        ends.append(end)
        outs.append(out)
    return begins, ends, outs


def windows(x, kernel, strides, dilations, begins, ends, outs, include_pad=False):
    """Every window's taps as a trailing axis (row-major tap order): input values, NaN
    for taps outside the input (0 for taps in the explicit pads when ``include_pad``),
    and the row-major flat input index of each tap."""
    rank = len(kernel)
    geometry = zip(ends, outs, strides, dilations, kernel, x.shape[2:], begins, strict=True)
    reach = [max(e, (o - 1) * s + d * (k - 1) + 1 - n - b) for e, o, s, d, k, n, b in geometry]
    padded = np.full(
        (*x.shape[:2], *(n + b + r for n, b, r in zip(x.shape[2:], begins, reach, strict=True))),
        np.nan,
    )
    if include_pad:
        region = tuple(
            slice(0, n + b + e) for n, b, e in zip(x.shape[2:], begins, ends, strict=True)
        )
        padded[(slice(None), slice(None), *region)] = 0.0
    inner = tuple(slice(b, b + n) for b, n in zip(begins, x.shape[2:], strict=True))
    padded[(slice(None), slice(None), *inner)] = x.astype(np.float64)
    flat = np.full(padded.shape, -1, np.int64)
    flat[(slice(None), slice(None), *inner)] = np.arange(x.size).reshape(x.shape)
    values, indices = [], []
    for taps in itertools.product(*(range(k) for k in kernel)):
        at = tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, s, d, o in zip(taps, strides, dilations, outs, strict=True)
        )
        values.append(padded[(slice(None), slice(None), *at)])
        indices.append(flat[(slice(None), slice(None), *at)])
    assert len(values[0].shape) == rank + 2
    return np.stack(values, -1), np.stack(indices, -1)


@st.composite
def pool_cases(draw, ceil=True, dilate=True):
    rank = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.integers(1, 2)) if dilate else 1 for _ in range(rank)]
    mode = draw(
        st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    )
    ceil_mode = int(ceil and mode == "NOTSET" and draw(st.booleans()))
    big = {1: 23, 2: 9, 3: 6}[rank]
    spatial = [
        draw(st.integers(d * (k - 1) + 1, big)) for k, d in zip(kernel, dilations, strict=True)
    ]
    pads = [draw(st.integers(0, k - 1)) for _ in range(2) for k in kernel]
    channels = draw(st.sampled_from([1, 2, 3]))
    x_shape = (draw(st.sampled_from([1, 2])), channels, *spatial)
    attrs = {"kernel_shape": kernel, "strides": strides, "auto_pad": mode}
    if dilate:
        attrs["dilations"] = dilations
    if ceil_mode:
        attrs["ceil_mode"] = 1
    if mode == "NOTSET":
        attrs["pads"] = pads
    geo = geometry(spatial, kernel, strides, dilations, mode, pads, ceil_mode)
    return x_shape, (kernel, strides, dilations, *geo), attrs


# ---- MaxPool -------------------------------------------------------------------------------


def _column_major(index, shape):
    """A row-major flat input index as (n*C + c)*size + the column-major spatial index."""
    size = int(np.prod(shape[2:]))
    base, spatial = index // size * size, index % size
    coords = np.unravel_index(spatial, shape[2:])
    return base + np.ravel_multi_index(coords, shape[2:], order="F")


@fast(30)
@given(case=pool_cases(), storage_order=st.sampled_from([0, 1]), seed=seeds)
def test_max_pool_with_indices(case, storage_order, seed):
    x_shape, geo, attrs = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, x_shape, np.float32)
    values, indices = windows(x, *geo)
    first = np.nanargmax(values, -1)  # the first max in scan order
    want = np.take_along_axis(values, first[..., None], -1)[..., 0].astype(np.float32)
    picked = np.take_along_axis(indices, first[..., None], -1)[..., 0]
    if storage_order:
        picked = _column_major(picked, x_shape)
    check_node("MaxPool", [x], [want, picked], storage_order=storage_order, opset=12, **attrs)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, np.float64])
def test_max_pool_dtypes(dtype):
    """Integer pools (opset 12) start from the dtype's minimum; ties pick the first index."""
    rng = np.random.default_rng(1)
    x = random_array(rng, (1, 2, 7, 6), dtype, 0 if dtype == np.uint8 else -5, 5)
    geo = (
        [3, 2],
        [2, 2],
        [1, 1],
        *geometry((7, 6), [3, 2], [2, 2], [1, 1], "NOTSET", [1, 0, 1, 1], 0),
    )
    values, indices = windows(x, *geo)
    first = np.nanargmax(values, -1)
    want = np.take_along_axis(values, first[..., None], -1)[..., 0].astype(dtype)
    picked = np.take_along_axis(indices, first[..., None], -1)[..., 0]
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}
    check_node("MaxPool", [x], [want, picked], opset=12, **attrs)


@pytest.mark.parametrize("opset", [7, 8, 10, 22])
def test_max_pool_opsets(opset):
    rng = np.random.default_rng(opset)
    x = random_array(rng, (1, 3, 9, 8), np.float32)
    geo = (
        [2, 3],
        [2, 1],
        [1, 1],
        *geometry((9, 8), [2, 3], [2, 1], [1, 1], "NOTSET", [0, 1, 1, 1], 0),
    )
    values, _ = windows(x, *geo)
    want = np.nanmax(values, -1).astype(np.float32)
    attrs = {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 1]}
    check_node("MaxPool", [x], want, opset=opset, **attrs)


# ---- AveragePool, LpPool -------------------------------------------------------------------


@fast(30)
@given(case=pool_cases(), include_pad=st.sampled_from([0, 1]), seed=seeds)
def test_average_pool(case, include_pad, seed):
    x_shape, geo, attrs = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, x_shape, np.float32)
    values, _ = windows(x, *geo, include_pad=bool(include_pad))
    want = np.nanmean(values, -1).astype(np.float32)
    tol = sum_tol(values.shape[-1])
    check_node("AveragePool", [x], want, tol=tol, opset=19, count_include_pad=include_pad, **attrs)


@pytest.mark.parametrize("opset", [7, 11])
def test_average_pool_older_opsets(opset):
    """Before opset 19 there are no dilations; before 10 no ceil_mode."""
    rng = np.random.default_rng(opset)
    x = random_array(rng, (2, 3, 10, 7), np.float32)
    pads = [1, 1, 0, 2]
    for include_pad in (0, 1):
        geo = (
            [3, 3],
            [3, 2],
            [1, 1],
            *geometry((10, 7), [3, 3], [3, 2], [1, 1], "NOTSET", pads, 0),
        )
        values, _ = windows(x, *geo, include_pad=bool(include_pad))
        want = np.nanmean(values, -1).astype(np.float32)
        attrs = {"kernel_shape": [3, 3], "strides": [3, 2], "pads": pads}
        check_node("AveragePool", [x], want, opset=opset, count_include_pad=include_pad, **attrs)


def test_average_pool_float16_accumulates_in_float32():
    rng = np.random.default_rng(2)
    x = random_array(rng, (1, 2, 12, 12), np.float16, 0, 1)
    geo = (
        [5, 5],
        [1, 1],
        [1, 1],
        *geometry((12, 12), [5, 5], [1, 1], [1, 1], "NOTSET", [2] * 4, 0),
    )
    values, _ = windows(x, *geo)
    want = np.nanmean(values, -1).astype(np.float16)
    check_node(
        "AveragePool",
        [x],
        want,
        tol={"rtol": 1e-3, "atol": 1e-3},
        kernel_shape=[5, 5],
        pads=[2] * 4,
    )


@fast(25)
@given(case=pool_cases(), p=st.sampled_from([1, 2, 3]), seed=seeds)
def test_lp_pool(case, p, seed):
    x_shape, geo, attrs = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, x_shape, np.float32, -2, 2)
    values, _ = windows(x, *geo)
    want = (np.nansum(np.abs(values) ** p, -1) ** (1.0 / p)).astype(np.float32)
    tol = {"rtol": 1e-4, "atol": 1e-5 * values.shape[-1]}
    check_node("LpPool", [x], want, tol=tol, opset=18, p=p, **attrs)


def test_lp_pool_opset_11():
    rng = np.random.default_rng(4)
    x = random_array(rng, (1, 2, 6, 5), np.float32, -2, 2)
    geo = (
        [2, 2],
        [1, 2],
        [1, 1],
        *geometry((6, 5), [2, 2], [1, 2], [1, 1], "NOTSET", [1, 0, 0, 1], 0),
    )
    values, _ = windows(x, *geo)
    want = np.sqrt(np.nansum(values**2, -1)).astype(np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [1, 2], "pads": [1, 0, 0, 1]}
    check_node("LpPool", [x], want, tol=MATH_TOL, opset=11, **attrs)


# ---- global pools --------------------------------------------------------------------------


@fast(10)
@given(spatial=shapes(1, 3, max_size=4000), channels=st.sampled_from([1, 3, 16]), seed=seeds)
def test_global_pools(spatial, channels, seed):
    rng = np.random.default_rng(seed)
    x = random_array(rng, (1, channels, *spatial), np.float32, -2, 2)
    axes = tuple(range(2, x.ndim))
    x64 = x.astype(np.float64)
    n = int(np.prod(spatial))
    check_node("GlobalMaxPool", [x], x.max(axis=axes, keepdims=True))
    mean = x64.mean(axis=axes, keepdims=True).astype(np.float32)
    check_node("GlobalAveragePool", [x], mean, tol=sum_tol(n))
    for p in (1, 2, 3):
        lp = (np.abs(x64) ** p).sum(axis=axes, keepdims=True) ** (1 / p)
        tol = {"rtol": 1e-4, "atol": 1e-5 * n}
        check_node("GlobalLpPool", [x], lp.astype(np.float32), tol=tol, p=p)


def test_global_pools_float16_and_int():
    rng = np.random.default_rng(6)
    x = random_array(rng, (2, 3, 31, 33), np.float16, 0, 1)
    mean = x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(np.float16)
    check_node("GlobalAveragePool", [x], mean, tol={"rtol": 1e-3, "atol": 1e-3})
    check_node("GlobalMaxPool", [x], x.max(axis=(2, 3), keepdims=True))


# ---- schedules and errors ------------------------------------------------------------------


def test_uniform_windows_divide_by_a_literal():
    """Without padding every window has k*k taps: no count temp, one kernel of 2 statements
    (the unrolled window sum of every output, then the divide)."""
    x = np.zeros((1, 2, 8, 8), np.float32)
    model, _ = node_model(
        "AveragePool", [x], [(np.float32, 4)], kernel_shape=[3, 3], strides=[1, 1]
    )
    (kernel,) = lower(load_graph(model)).kernels
    assert len(kernel.statements) == 2
    assert set(kernel.buffers()) == {"x0", "y0"}


def test_only_border_outputs_start_at_the_identity():
    """The interior outputs are written whole by the unrolled window: the init and the
    tap-by-tap update cover the border outputs only (each output written once)."""
    x = np.zeros((1, 2, 40, 40), np.float32)
    (kernel,) = _lower("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]).kernels
    init, update, interior = kernel.statements
    points = [int(isl.Set(s.domain).count_val().to_python()) for s in (init, interior)]
    assert points == [2 * (20 * 20 - 19 * 19), 2 * 19 * 19]  # outputs 20x20, 1..19 inside
    assert update.reduce == "max"


def test_max_pool_ignores_padding_even_when_all_negative():
    """A padded position is not a 0 (or -inf) candidate: it is not in the domain."""
    x = -np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    (got,) = run_node("MaxPool", [x], [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    want = np.array([[-1, -1, -2], [-1, -1, -2], [-4, -4, -5]], np.float32)
    np.testing.assert_array_equal(got[0, 0], want)


def test_max_pool_nan():
    """max propagates NaN, as numpy does; its index is the window's first NaN."""
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 1, 0] = x[0, 0, 1, 3] = np.nan
    y, i = run_node("MaxPool", [x], [x, x.astype(np.int64)], kernel_shape=[2, 2], strides=[2, 2])
    np.testing.assert_array_equal(y[0, 0], [[np.nan, np.nan], [13, 15]])
    np.testing.assert_array_equal(i[0, 0], [[4, 7], [13, 15]])


def _lower(op_type, x, **attrs):
    model, _ = node_model(op_type, [x], [(np.float32, x.ndim)], **attrs)
    return lower(load_graph(model))


def test_kernel_shape_is_required():
    x = np.zeros((1, 1, 4, 4), np.float32)
    model, _ = node_model("MaxPool", [x], [(np.float32, 4)])
    with pytest.raises((polyonnx.LoweringError, polyonnx.ModelError), match="kernel_shape"):
        lower(load_graph(model))


def test_window_must_fit():
    x = np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(polyonnx.LoweringError, match=r"'maxpool_node'.*does not fit axis 2"):
        _lower("MaxPool", x, kernel_shape=[3, 3])


def test_average_pool_needs_floats():
    x = np.zeros((1, 1, 4, 4), np.int32)
    model, _ = node_model("AveragePool", [x], [(np.int32, 4)], kernel_shape=[2, 2])
    with pytest.raises((polyonnx.LoweringError, polyonnx.ModelError), match="int32"):
        lower(load_graph(model))


def test_unknown_auto_pad():
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises((polyonnx.LoweringError, polyonnx.ModelError), match="SAME_MIDDLE"):
        _lower("MaxPool", x, kernel_shape=[2, 2], auto_pad="SAME_MIDDLE")


# ---- separable, global-window and flat lowerings; the stencil schedule ----------------------


def _stencil_run(op_type, x, outputs=1, opset=19, **attrs):
    """The node compiled with stencil_schedule for every kernel that has a window (the
    default for the others); its outputs and the schedules used."""
    outs = [(x.dtype, x.ndim)] * outputs
    model, feed = node_model(op_type, [x], outs, opset=opset, **attrs)
    program = lower(load_graph(model))
    schedules = [
        stencil_schedule(k, program.buffers, 16) or default_schedule(k, program.buffers)
        for k in program.kernels
    ]
    out = compile_program(program, schedules).run(feed)
    return [out[name] for name in program.outputs], schedules


def _pool_reference(op_type, x, geo, include_pad=0):
    values, indices = windows(x, *geo, include_pad=bool(include_pad))
    if op_type == "MaxPool":
        first = np.nanargmax(values, -1)
        want = np.take_along_axis(values, first[..., None], -1)[..., 0].astype(x.dtype)
        return want, np.take_along_axis(indices, first[..., None], -1)[..., 0], values
    return np.nanmean(values, -1).astype(x.dtype), None, values


@st.composite
def strided_cases(draw):
    """2-D and 3-D pools whose innermost windowed axis is strided with 3+ taps: the
    separable lowering (odd sizes, asymmetric pads, dilations, ceil_mode)."""
    rank = draw(st.integers(2, 3))
    kernel = [draw(st.integers(1, 4)) for _ in range(rank - 1)] + [draw(st.integers(3, 4))]
    strides = [draw(st.integers(1, 3)) for _ in range(rank - 1)] + [draw(st.integers(2, 3))]
    dilations = [draw(st.integers(1, 2)) for _ in range(rank)]
    ceil_mode = draw(st.sampled_from([0, 1]))
    big = {2: 19, 3: 9}[rank]
    spatial = [
        draw(st.integers(d * (k - 1) + 1, big)) for k, d in zip(kernel, dilations, strict=True)
    ]
    pads = [draw(st.integers(0, k - 1)) for _ in range(2) for k in kernel]
    x_shape = (draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3])), *spatial)
    attrs = {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "ceil_mode": ceil_mode,
    }
    geo = geometry(spatial, kernel, strides, dilations, "NOTSET", pads, ceil_mode)
    return x_shape, (kernel, strides, dilations, *geo), attrs


@fast(30)
@given(case=strided_cases(), include_pad=st.sampled_from([0, 1]), seed=seeds)
def test_separable_pools(case, include_pad, seed):
    """Strided windows, through a padded copy or (more than MAX_UNROLLED_TAPS taps) axis
    by axis through temps; the default and the stencil schedule both match the
    reference, MaxPool's Indices too."""
    x_shape, geo, attrs = case
    x = random_array(np.random.default_rng(seed), x_shape, np.float32)
    want, picked, values = _pool_reference("MaxPool", x, geo)
    check_node("MaxPool", [x], [want, picked], opset=12, **attrs)
    (y, i), _ = _stencil_run("MaxPool", x, outputs=2, opset=12, **attrs)
    assert_matches(y, want)
    np.testing.assert_array_equal(i, picked)
    mean, _, values = _pool_reference("AveragePool", x, geo, include_pad)
    tol = sum_tol(values.shape[-1])
    check_node("AveragePool", [x], mean, tol=tol, opset=19, count_include_pad=include_pad, **attrs)
    (avg,), _ = _stencil_run("AveragePool", x, count_include_pad=include_pad, **attrs)
    assert_matches(avg, mean, tol)


def test_separable_pool_structure():
    """A strided window too big to unroll (7x7) on a small plane: a column pass into a
    temp, then a row pass, each with the window outside a SIMD loop along the row under
    the stencil schedule."""
    x = np.random.default_rng(0).standard_normal((1, 4, 21, 19)).astype(np.float32)
    attrs = {"kernel_shape": [7, 7], "strides": [2, 2], "pads": [3, 3, 3, 3]}
    (kernel,) = _lower("MaxPool", x, **attrs).kernels
    assert len(kernel.statements) == 4
    assert any(".pass0" in b for b in kernel.buffers())
    geo = (
        [7, 7],
        [2, 2],
        [1, 1],
        *geometry((21, 19), [7, 7], [2, 2], [1, 1], "NOTSET", [3] * 4, 0),
    )
    (y,), (schedule,) = _stencil_run("MaxPool", x, **attrs)
    assert_matches(y, _pool_reference("MaxPool", x, geo)[0])
    nest = {n.statement: n.names() for n in schedule.state.nests}
    assert nest["S1"] == ["n", "c", "o0", "k0", "w1"]
    assert nest["S3"] == ["n", "c", "o0", "k1", "o1"]
    assert schedule.state.marked("w1", "vectorize") and schedule.state.marked("o1", "vectorize")


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((1, 3, 7, 7), {"kernel_shape": [7, 7]}),
        ((2, 5, 6, 6), {"kernel_shape": [7, 7], "pads": [0, 0, 1, 1]}),
        ((1, 4, 5), {"kernel_shape": [6], "pads": [1, 0]}),
        ((1, 2, 1, 4), {"kernel_shape": [3, 4], "dilations": [2, 1], "pads": [2, 0, 2, 0]}),
    ],
)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_pools_whose_window_covers_the_input(shape, attrs, include_pad):
    """One window over every input position: a flat reduction over a view, no window."""
    x = random_array(np.random.default_rng(3), shape, np.float32)
    rank = len(shape) - 2
    full = {"strides": [1] * rank, "dilations": [1] * rank, "pads": [0] * (2 * rank), **attrs}
    geo = (
        full["kernel_shape"],
        full["strides"],
        full["dilations"],
        *geometry(shape[2:], *(full[k] for k in ("kernel_shape", "strides", "dilations")),
                  "NOTSET", full["pads"], 0),
    )  # fmt: skip
    model, _ = node_model(
        "AveragePool", [x], [(np.float32, x.ndim)], opset=19, count_include_pad=include_pad, **attrs
    )
    (kernel,) = lower(load_graph(model)).kernels
    assert "S1[n, c, s]" in kernel.statements[1].domain
    mean, _, values = _pool_reference("AveragePool", x, geo, include_pad)
    check_node(
        "AveragePool", [x], mean, tol=sum_tol(values.shape[-1]), opset=19,
        count_include_pad=include_pad, **attrs,
    )  # fmt: skip
    want, picked, _ = _pool_reference("MaxPool", x, geo)
    check_node("MaxPool", [x], [want, picked], opset=12, **attrs)


@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_small_planes_pool_a_padded_copy(op_type, strides):
    """A padded 3x3 window on a 7x7 plane has too few interior outputs to unroll alone:
    the input is copied into a padded temp (pads = the reduction's identity), every output
    is then one unrolled expression, along the flattened plane when the stride is 1. The
    input is all negative, so a pad read as 0 instead of -inf would show in MaxPool; the
    second run reuses the intermediates' memory of the first."""
    x = -np.random.default_rng(3).uniform(1, 2, (2, 3, 7, 7)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": strides, "pads": [1, 1, 1, 1]}
    (kernel,) = _lower(op_type, x, **attrs).kernels
    temps = [b for b in kernel.buffers() if ".padded" in b or b.endswith(".flat.tmp2")]
    assert len(temps) == (2 if strides == [1, 1] else 1)
    assert not any(s.reduce for s in kernel.statements[:4])  # no tap-by-tap update
    geo = (
        [3, 3],
        strides,
        [1, 1],
        *geometry((7, 7), [3, 3], strides, [1, 1], "NOTSET", [1] * 4, 0),
    )
    for include_pad in (0, 1) if op_type == "AveragePool" else (0,):
        want, _, values = _pool_reference(op_type, x, geo, include_pad)
        extra = {"count_include_pad": include_pad} if op_type == "AveragePool" else {}
        model, feed = node_model(op_type, [x], [(np.float32, 4)], **attrs, **extra)
        session = polyonnx.InferenceSession(model)
        for scale in (1.0, 3.0):
            (got,) = session.run(None, {k: v * scale for k, v in feed.items()})
            assert_matches(got, (want * scale).astype(np.float32), sum_tol(values.shape[-1]))


@pytest.mark.parametrize(("size", "fused"), [(7, True), (14, True), (28, False)])
def test_small_padded_planes_run_a_channel_at_a_time(size, fused):
    """Up to POOL_PLANE points a channel, the passes of a pool through a padded copy run
    under one loop over channels (its planes stay in L1); bigger planes run pass by
    pass. Both match the reference."""
    x = random_array(np.random.default_rng(size), (1, 5, size, size), np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    model, feed = node_model("AveragePool", [x], [(np.float32, 4)], **attrs)
    program = lower(load_graph(model))
    (kernel,) = program.kernels
    schedule = default_schedule(kernel, program.buffers)
    assert bool(schedule.state.attach) == fused
    geo = (
        [3, 3],
        [1, 1],
        [1, 1],
        *geometry((size, size), [3, 3], [1, 1], [1, 1], "NOTSET", [1] * 4, 0),
    )
    want, _, values = _pool_reference("AveragePool", x, geo)
    (got,) = compile_program(program, [schedule]).run(feed).values()
    assert_matches(got, want, sum_tol(values.shape[-1]))


def test_window_reductions_run_a_channel_at_a_time_around_simd_rows():
    """A strided pool with an unrolled interior: its init, border and interior share one
    loop over channels, the border's taps outside its SIMD output rows."""
    x = random_array(np.random.default_rng(3), (1, 4, 40, 40), np.float32)
    model, feed = node_model(
        "MaxPool", [x], [(np.float32, 4)], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4
    )
    program = lower(load_graph(model))
    (kernel,) = program.kernels
    schedule = default_schedule(kernel, program.buffers)
    state = schedule.state
    assert set(state.attach) == {s.name for s in kernel.statements[1:]}
    border = state.nest(kernel.statements[1].name).names()
    assert border[-3:-1] == ["k0", "k1"] and state.marked(border[-1], VECTORIZE)
    (got,) = compile_program(program, [schedule]).run(feed).values()
    geo = (
        [3, 3],
        [2, 2],
        [1, 1],
        *geometry((40, 40), [3, 3], [2, 2], [1, 1], "NOTSET", [1] * 4, 0),
    )
    assert_matches(got, _pool_reference("MaxPool", x, geo)[0])


def test_global_pools_reduce_a_flat_view_in_simd():
    """7x7 maps (ResNet-50's last pool) reduce 49 contiguous values per channel."""
    x = random_array(np.random.default_rng(5), (1, 20, 7, 7), np.float32)
    (kernel,) = _lower("GlobalAveragePool", x).kernels
    (read,) = [a for a in kernel.buffers() if a.endswith(".flat")]
    assert "S1[n, c, s]" in kernel.statements[1].domain and read == "x0.flat"
    check_node("GlobalAveragePool", [x], x.mean(axis=(2, 3), keepdims=True), tol=sum_tol(49))
    (y,), _ = _stencil_run("GlobalMaxPool", x, opset=17)
    assert_matches(y, x.max(axis=(2, 3), keepdims=True))


def test_stencil_schedule_declines_other_kernels():
    """No window (an elementwise op), or a contraction: None, the default stays."""
    x = np.zeros((1, 2, 8, 8), np.float32)
    model, _ = node_model("Relu", [x], [(np.float32, 4)])
    program = lower(load_graph(model))
    assert stencil_schedule(program.kernels[0], program.buffers, 16) is None
    a, b = np.zeros((8, 8), np.float32), np.zeros((8, 8), np.float32)
    model, _ = node_model("MatMul", [a, b], [(np.float32, 2)])
    program = lower(load_graph(model))
    assert stencil_schedule(program.kernels[0], program.buffers, 16) is None


@fast(20)
@given(case=pool_cases(), seed=seeds)
def test_stencil_schedule_matches_the_reference(case, seed):
    """Any pool (1-D to 3-D, pads, strides, dilations, ceil_mode) under the stencil
    schedule: MaxPool with Indices and AveragePool with its tap counts."""
    x_shape, geo, attrs = case
    x = random_array(np.random.default_rng(seed), x_shape, np.float32)
    want, picked, _ = _pool_reference("MaxPool", x, geo)
    (y, i), _ = _stencil_run("MaxPool", x, outputs=2, opset=12, **attrs)
    assert_matches(y, want)
    np.testing.assert_array_equal(i, picked)
    mean, _, values = _pool_reference("AveragePool", x, geo)
    (avg,), _ = _stencil_run("AveragePool", x, **attrs)
    assert_matches(avg, mean, sum_tol(values.shape[-1]))
