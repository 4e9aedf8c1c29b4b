"""Quantisation lowerings (polyonnx/krnl/ops/quant.py) against numpy references:
QuantizeLinear and DequantizeLinear per tensor, per axis and per block for every integer
type, DynamicQuantizeLinear, MatMulInteger, QLinearMatMul and QLinearConv."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyonnx
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.ir import DTYPES
from polyonnx.krnl.lower import lower
from tests.helpers import (
    assert_matches,
    check_node,
    const,
    fast,
    node_model,
    random_array,
    run_node,
    seeds,
    shapes,
)
from tests.krnl.test_conv import conv_ref, out_size

QTYPES = [np.int8, np.uint8, np.int16, np.uint16]
ONNX_CODES = {np.int8: 3, np.uint8: 2, np.int16: 5, np.uint16: 4, np.int32: 6}


# ---- references ---------------------------------------------------------------------------


def _expand(param: np.ndarray, shape, axis: int, block: int) -> np.ndarray:
    """A per-tensor, per-axis or blocked parameter, repeated to ``shape``."""
    if param.size == 1:
        return param.reshape(())
    if block:
        return np.repeat(param, block, axis=axis).take(range(shape[axis]), axis=axis)
    dims = [1] * len(shape)
    dims[axis] = param.size
    return param.reshape(dims)


def quantize_ref(x, scale, zero, dtype, axis=1, block=0):
    """rint(x / scale) in the scale's precision, + zero point, saturated (NaN → low end)."""
    s = _expand(scale, x.shape, axis, block)
    precision = scale.dtype if np.issubdtype(scale.dtype, np.floating) else np.float64
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((x.astype(precision) / s.astype(precision)).astype(np.float64))
    if zero is not None:
        q = q + _expand(zero, x.shape, axis, block)
    info = np.iinfo(dtype)
    q = np.where(np.isnan(q), info.min, q)
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize_ref(x, scale, zero, axis=1, block=0, dtype=None):
    d = x.astype(np.int64)
    if zero is not None:
        d = d - _expand(zero, x.shape, axis, block)
    wide = np.float64 if x.dtype == np.int32 or scale.dtype == np.float64 else np.float32
    y = d.astype(wide) * _expand(scale, x.shape, axis, block).astype(wide)
    return y.astype(dtype or scale.dtype)


def _scale(rng, shape, dtype=np.float32):
    return random_array(rng, shape, dtype, 0.01, 0.5)


def _zero(rng, shape, dtype):
    info = np.iinfo(dtype)
    return random_array(rng, shape, dtype, max(info.min, -100), min(info.max, 100))


@st.composite
def quant_layouts(draw):
    """(x shape, scale/zero point shape, axis, block_size) for every granularity."""
    shape = draw(shapes(min_rank=1, max_rank=4, max_size=4000), label="shape")
    mode = draw(st.sampled_from(["tensor", "tensor1", "axis", "block"]), label="mode")
    rank = len(shape)
    axis = draw(st.integers(-rank, rank - 1), label="axis")
    if mode == "tensor":
        return shape, (), axis, 0
    if mode == "tensor1":
        return shape, (1,), axis, 0
    if mode == "axis":
        return shape, (shape[axis],), axis, 0
    block = draw(st.integers(1, max(1, shape[axis])), label="block_size")
    pshape = list(shape)
    pshape[axis] = -(-shape[axis] // block)
    return shape, tuple(pshape), axis, block


# ---- QuantizeLinear -----------------------------------------------------------------------


@fast(40)
@given(
    layout=quant_layouts(),
    dtype=st.sampled_from(QTYPES),
    zero=st.booleans(),
    constants=st.booleans(),
    x_dtype=st.sampled_from([np.float32, np.float16]),
    seed=seeds,
)
def test_quantize_linear(layout, dtype, zero, constants, x_dtype, seed):
    shape, pshape, axis, block = layout
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape, x_dtype, -60, 60)
    scale = _scale(rng, pshape)
    zp = _zero(rng, pshape, dtype) if zero else None
    wrap = const if constants else (lambda a: a)
    args = [x, wrap(scale)] + ([wrap(zp)] if zero else [])
    attrs = {"axis": axis}
    if block:
        attrs["block_size"] = block
    if not zero:
        attrs["output_dtype"] = ONNX_CODES[dtype]
    expected = quantize_ref(x, scale, zp, dtype, axis, block)
    check_node("QuantizeLinear", args, expected, opset=21, **attrs)


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e9, -1e9, np.inf, -np.inf, np.nan, 3.49],
                 np.float32)  # fmt: skip
    for dtype in QTYPES:
        zp = np.array(0 if np.iinfo(dtype).min < 0 else 7, dtype)
        expected = quantize_ref(x, np.array(1, np.float32), zp, dtype)
        check_node("QuantizeLinear", [x, np.float32(1), zp], expected, opset=13)
    exact = [0, 2, 2, 0, -2, -2, 127, -128, 127, -128, -128, 3]
    check_node("QuantizeLinear", [x, np.float32(1), np.int8(0)], np.array(exact, np.int8), opset=13)


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23])
def test_quantize_opsets_default_to_uint8(opset):
    rng = np.random.default_rng(opset)
    x = random_array(rng, (3, 5), np.float32, -10, 40)
    scale = np.float32(0.2)
    check_node(
        "QuantizeLinear", [x, scale], quantize_ref(x, np.asarray(scale), None, np.uint8),
        opset=opset,
    )  # fmt: skip


def test_quantize_float16_scale_divides_in_float16():
    rng = np.random.default_rng(1)
    x = random_array(rng, (64,), np.float16, -30, 30)
    scale = np.float16(0.37)
    expected = quantize_ref(x, np.asarray(scale), np.int8(3), np.int8)
    check_node("QuantizeLinear", [x, scale, np.int8(3)], expected, opset=19)


def test_quantize_precision_attribute():
    """precision=float64 divides a float32 x by a float16 scale in float64."""
    rng = np.random.default_rng(2)
    x = random_array(rng, (5, 7), np.float32, -30, 30)
    scale = np.float16(0.3)
    q = np.rint(x.astype(np.float64) / np.float64(scale))
    expected = np.clip(q, 0, 255).astype(np.uint8)
    check_node("QuantizeLinear", [x, scale], expected, opset=23, precision=11)


def test_quantize_int32_input():
    x = np.array([-7, 0, 5, 1000, 2**30], np.int32)
    scale = np.float32(2)
    check_node(
        "QuantizeLinear", [x, scale, np.int16(1)],
        quantize_ref(x, np.asarray(scale), np.int16(1), np.int16), opset=21,
    )  # fmt: skip


# ---- DequantizeLinear ---------------------------------------------------------------------


@fast(40)
@given(
    layout=quant_layouts(),
    dtype=st.sampled_from([*QTYPES, np.int32]),
    zero=st.booleans(),
    scale_dtype=st.sampled_from([np.float32, np.float16]),
    seed=seeds,
)
def test_dequantize_linear(layout, dtype, zero, scale_dtype, seed):
    shape, pshape, axis, block = layout
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = random_array(rng, shape, dtype, max(info.min, -(2**20)), min(info.max, 2**20))
    scale = _scale(rng, pshape, scale_dtype)
    zp = _zero(rng, pshape, dtype) if zero else None
    args = [x, scale] + ([zp] if zero else [])
    attrs = {"axis": axis}
    if block:
        attrs["block_size"] = block
    expected = dequantize_ref(x, scale, zp, axis, block)
    check_node("DequantizeLinear", args, expected, opset=21, **attrs)


def test_dequantize_int32_rounds_once_into_float16():
    """int32 is scaled in float64, and a float16 result is rounded once from there; through
    float32 rounded to nearest, this value would round twice and land an ulp off."""
    x, scale = np.array([791857], np.int32), np.float16(0.0413)
    product = x.astype(np.float64) * np.float64(scale)
    exact = product.astype(np.float16)
    assert (exact != product.astype(np.float32).astype(np.float16)).all()
    got = run_node("DequantizeLinear", [x, scale], [exact], opset=21)[0]
    np.testing.assert_array_equal(got, exact)


def test_dequantize_output_dtype():
    rng = np.random.default_rng(4)
    x = random_array(rng, (4, 6), np.uint8, 0, 255)
    scale, zp = np.float32(0.05), np.uint8(128)
    expected = dequantize_ref(x, np.asarray(scale), np.asarray(zp), dtype=np.float16)
    check_node("DequantizeLinear", [x, scale, zp], expected, opset=23, output_dtype=10)


@pytest.mark.parametrize("opset", [10, 13, 19])
def test_dequantize_older_opsets(opset):
    rng = np.random.default_rng(opset)
    x = random_array(rng, (2, 3, 4), np.int8, -128, 127)
    scale = _scale(rng, (3,))
    zp = _zero(rng, (3,), np.int8)
    if opset == 10:
        scale, zp = scale[:1].reshape(()), zp[:1].reshape(())
    check_node("DequantizeLinear", [x, scale, zp], dequantize_ref(x, scale, zp), opset=opset)


def test_round_trip_is_the_identity_on_the_grid():
    x = np.arange(-128, 128, dtype=np.int8)
    scale, zp = np.float32(0.125), np.int8(-3)
    y = run_node("DequantizeLinear", [x, scale, zp], [np.zeros(256, np.float32)], opset=13)[0]
    check_node("QuantizeLinear", [y, scale, zp], np.clip(x.astype(int), -128, 127).astype(np.int8))


# ---- DynamicQuantizeLinear ----------------------------------------------------------------


def dynamic_ref(x):
    """onnxruntime's: scale = (max(0, max x) - min(0, min x)) / 255, or 1 when that is 0."""
    hi, lo = np.float32(max(0, x.max())), np.float32(min(0, x.min()))
    scale = np.float32(1) if hi == lo else np.float32(hi - lo) / np.float32(255)
    zero = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8)
    return [y, np.array(scale, np.float32), np.array(zero, np.uint8)]


@fast(25)
@given(
    shape=shapes(min_rank=0, max_rank=4, max_size=5000),
    bounds=st.sampled_from([(-3, 7), (1, 9), (-9, -2), (-1e-3, 1e-3), (-100, 100)]),
    seed=seeds,
)
def test_dynamic_quantize_linear(shape, bounds, seed):
    x = random_array(np.random.default_rng(seed), shape, np.float32, *bounds)
    check_node("DynamicQuantizeLinear", [x], dynamic_ref(x), opset=11)


def test_dynamic_quantize_all_zeros():
    x = np.zeros((3, 4), np.float32)
    expected = [np.zeros((3, 4), np.uint8), np.array(1, np.float32), np.array(0, np.uint8)]
    check_node("DynamicQuantizeLinear", [x], expected, opset=11)


# ---- MatMulInteger, QLinearMatMul ---------------------------------------------------------


@st.composite
def matmul_cases(draw):
    """A and B shapes (numpy matmul, batch broadcast, 1-D operands) and zero point shapes
    (scalar, a vector, or the N-D per-row / per-column form)."""
    dim = st.sampled_from([1, 2, 3, 5, 16, 17])
    m, k, n = draw(dim), draw(dim), draw(dim)
    batch = draw(st.lists(st.sampled_from([1, 2, 3]), max_size=2))
    a = (*batch, m, k) if draw(st.booleans()) else (k,)
    ones = [1 if draw(st.booleans()) else d for d in batch]
    b_batch = ones[len(ones) - draw(st.integers(0, len(ones))) :]  # a suffix: numpy aligns right
    b = (*b_batch, k, n) if draw(st.booleans()) else (k,)
    forms = ["scalar", "vector", "nd"] if len(a) > 1 else ["scalar"]
    a_form = draw(st.sampled_from(forms))
    forms = ["scalar", "vector", "nd"] if len(b) > 1 else ["scalar"]
    b_form = draw(st.sampled_from(forms))
    a_zp = {"scalar": (), "vector": (m,), "nd": (*a[:-1], 1)}[a_form]
    b_zp = {"scalar": (), "vector": (n,), "nd": (*b[:-2], 1, b[-1] if len(b) > 1 else 1)}[b_form]
    return a, b, a_zp, b_zp


def _rows(param, operand_shape, row):
    """A per-row (per-column) parameter shaped to broadcast against its operand."""
    if param.ndim == 1 and param.size > 1:
        return param.reshape(-1, 1) if row else param.reshape(1, -1)
    return param


@fast(30)
@given(case=matmul_cases(), dtypes=st.sampled_from([(np.uint8, np.int8), (np.int8, np.int8),
                                                    (np.uint8, np.uint8)]), seed=seeds)  # fmt: skip
def test_matmul_integer(case, dtypes, seed):
    a_shape, b_shape, a_zp_shape, b_zp_shape = case
    rng = np.random.default_rng(seed)
    a, b = _zero(rng, a_shape, dtypes[0]), _zero(rng, b_shape, dtypes[1])
    az, bz = _zero(rng, a_zp_shape, dtypes[0]), _zero(rng, b_zp_shape, dtypes[1])
    ca = a.astype(np.int64) - _rows(az, a_shape, True)
    cb = b.astype(np.int64) - _rows(bz, b_shape, False)
    expected = np.matmul(ca, cb).astype(np.int32)
    check_node("MatMulInteger", [a, b, az, bz], expected, opset=10)


def test_matmul_integer_without_zero_points():
    rng = np.random.default_rng(0)
    a, b = _zero(rng, (5, 33), np.uint8), _zero(rng, (33, 7), np.int8)
    expected = (a.astype(np.int32) @ b.astype(np.int32)).astype(np.int32)
    check_node("MatMulInteger", [a, b], expected, opset=10)


def qlinear_matmul_ref(a, sa, za, b, sb, zb, sy, zy):
    """The ONNX reference's arithmetic (int32 sums, multiplier in the scales' dtype, the
    rest in float64) with per-row / per-column parameters; 1-D operands promoted as numpy
    does, then squeezed."""
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = np.matmul(
        a2.astype(np.int64) - _rows(za, a2.shape, True),
        b2.astype(np.int64) - _rows(zb, b2.shape, False),
    )
    multiplier = (_rows(sa, a2.shape, True) * _rows(sb, b2.shape, False) / sy).astype(np.float64)
    info = np.iinfo(zy.dtype)
    y = np.clip(np.rint(acc * multiplier + zy), info.min, info.max).astype(zy.dtype)
    y = np.broadcast_to(y, acc.shape)
    if a.ndim == 1:
        y = y[..., 0, :]
    if b.ndim == 1:
        y = y[..., 0]
    return y


@fast(30)
@given(
    case=matmul_cases(),
    dtype=st.sampled_from([np.uint8, np.int8]),
    scale_dtype=st.sampled_from([np.float32, np.float16]),
    seed=seeds,
)
def test_qlinear_matmul(case, dtype, scale_dtype, seed):
    a_shape, b_shape, a_zp_shape, b_zp_shape = case
    rng = np.random.default_rng(seed)
    a, b = _zero(rng, a_shape, dtype), _zero(rng, b_shape, dtype)
    za, zb = _zero(rng, a_zp_shape, dtype), _zero(rng, b_zp_shape, dtype)
    sa, sb = _scale(rng, a_zp_shape, scale_dtype), _scale(rng, b_zp_shape, scale_dtype)
    sy, zy = _scale(rng, (), scale_dtype) * 30, _zero(rng, (), dtype)
    expected = qlinear_matmul_ref(a, sa, za, b, sb, zb, sy, zy)
    check_node("QLinearMatMul", [a, sa, za, b, sb, zb, sy, zy], expected, opset=21)


def test_qlinear_matmul_saturates():
    a = np.full((2, 4), 255, np.uint8)
    b = np.array([[255, 0, 200]] * 4, np.uint8)
    s, z = np.float32(1), np.uint8(0)
    # sums 4*255*127 (high), 4*255*-128 (low) and 4*255*72
    expected = np.array([[255, 0, 255]] * 2, np.uint8)
    check_node("QLinearMatMul", [a, s, z, b, s, np.uint8(128), s, z], expected, opset=10)


# ---- QLinearConv ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 3, 7, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((2, 4, 9, 9), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "dilations": [1, 2]}),
        ((1, 3, 17), (3, 1, 5), {"group": 3, "auto_pad": "SAME_UPPER"}),
    ],
)
def test_qlinear_conv(dtype, per_channel, bias, x_shape, w_shape, attrs):
    rng = np.random.default_rng(sum(x_shape) + len(attrs))
    m = w_shape[0]
    x, w = _zero(rng, x_shape, dtype), _zero(rng, w_shape, dtype)
    xs, xz = _scale(rng, ()), _zero(rng, (), dtype)
    ws, wz = (
        _scale(rng, (m,) if per_channel else ()),
        _zero(rng, (m,) if per_channel else (), dtype),
    )
    ys, yz = np.float32(2.5), _zero(rng, (), dtype)
    b = rng.integers(-500, 500, size=(m,)).astype(np.int32) if bias else None
    rank = len(x_shape) - 2
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    pads = attrs.get("pads", [0] * 2 * rank)
    if attrs.get("auto_pad") == "SAME_UPPER":  # (stride 1: the output has the input's size)
        total = [d * (k - 1) for d, k in zip(dilations, w_shape[2:], strict=True)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    geometry = zip(x_shape[2:], w_shape[2:], strides, dilations, strict=True)
    outs = [
        out_size(n, k, s, d, pads[r], pads[rank + r]) for r, (n, k, s, d) in enumerate(geometry)
    ]
    wc = w.astype(np.int64) - (wz.reshape(m, *[1] * (rank + 1)) if per_channel else wz)
    acc = conv_ref(x.astype(np.int64) - xz, wc, b, attrs.get("group", 1), strides, dilations,
                   pads[:rank], outs)  # fmt: skip
    mult = (xs * ws / ys).astype(np.float64)
    mult = mult.reshape(1, m, *[1] * rank) if per_channel else mult
    info = np.iinfo(dtype)
    expected = np.clip(np.rint(acc * mult + yz), info.min, info.max).astype(dtype)
    args = [x, xs, xz, w, ws, wz, ys, yz] + ([b] if bias else [])
    check_node("QLinearConv", args, expected, opset=10, **attrs)


# ---- preconditions ------------------------------------------------------------------------


def _lower(op, args, out_dtype, rank, **attrs):
    model, _ = node_model(op, args, [(out_dtype, rank)], **attrs)
    return lower(load_graph(model))


SMALL_INTS = {"int4": 22, "uint4": 21, "int2": 26, "uint2": 25}
SMALL_FLOATS = {
    "float8_e4m3fn": 17, "float8_e4m3fnuz": 18, "float8_e5m2": 19, "float8_e5m2fnuz": 20,
    "float4_e2m1fn": 23,
}  # fmt: skip


def _small_out(name, x, attrs, opset=21):
    """QuantizeLinear into a narrow type named by output_dtype (all inputs float32)."""
    scale = np.float32(0.25)
    code = {**SMALL_INTS, **SMALL_FLOATS}[name]
    dtype = np.dtype(getattr(ml_dtypes, name))
    if name not in DTYPES:  # the runtime does not have it: a clear refusal
        with pytest.raises(
            polyonnx.LoweringError, match=rf"output_dtype \({code}\) has dtype {name}"
        ):
            _lower("QuantizeLinear", [x, const(scale)], dtype, x.ndim, opset=opset,
                   output_dtype=code, **attrs)  # fmt: skip
        return None, None
    got = run_node("QuantizeLinear", [x, scale], [np.zeros(x.shape, dtype)], opset=opset,
                   output_dtype=code, **attrs)[0]  # fmt: skip
    return got, x / scale


@pytest.mark.parametrize("name", list(SMALL_INTS))
def test_quantize_to_small_ints(name):
    x = np.array([-5, -1.1, -0.125, 0, 0.125, 0.375, 0.4, 1, 1.9, 30, np.inf, np.nan], np.float32)
    got, ratio = _small_out(name, x, {})
    if got is None:
        return
    info = ml_dtypes.iinfo(getattr(ml_dtypes, name))
    q = np.where(np.isnan(ratio), info.min, np.clip(np.rint(ratio), info.min, info.max))
    np.testing.assert_array_equal(got.astype(np.int32), q.astype(np.int32))


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("name", list(SMALL_FLOATS))
def test_quantize_to_small_floats(name, saturate):
    x = np.array([-1e5, -3.3, -0.01, 0, 0.3, 1.7, 96, 500, 1e5, np.inf, -np.inf, np.nan],
                 np.float32)  # fmt: skip
    got, ratio = _small_out(name, x, {"saturate": saturate})
    if got is None:
        return
    dtype = getattr(ml_dtypes, name)
    if saturate or name == "float4_e2m1fn":  # (float4 always saturates)
        top = float(ml_dtypes.finfo(dtype).max)
        ratio = np.clip(ratio, -top, top)
    expected = ratio.astype(dtype).astype(np.float32)
    np.testing.assert_array_equal(got.astype(np.float32), expected)


@pytest.mark.parametrize("name", ["int4", "uint4", "float8_e4m3fn", "float8_e5m2"])
def test_dequantize_small_types(name):
    dtype = getattr(ml_dtypes, name)
    if name.startswith("float"):
        x = np.array([-448, -3.5, -0.25, 0, 0.5, 1, 96, 240], np.float32).astype(dtype)
        zp = None
        expected = x.astype(np.float32) * np.float32(0.5)
    else:
        x = np.arange(-8 if name == "int4" else 0, 8 if name == "int4" else 16).astype(dtype)
        zp = np.array(1, dtype)
        expected = (x.astype(np.float32) - 1) * np.float32(0.5)
    args = [x, np.float32(0.5)] + ([zp] if zp is not None else [])
    if name not in DTYPES:
        with pytest.raises(polyonnx.PolyonnxError, match=name):
            run_node("DequantizeLinear", args, [expected], opset=21)
        return
    check_node("DequantizeLinear", args, expected, opset=21)


def test_per_axis_scale_must_match_the_axis():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(polyonnx.LoweringError, match=r"neither a scalar nor a vector of the 3"):
        _lower("QuantizeLinear", [x, const(np.ones(2, np.float32))], np.uint8, 2, opset=13)


def test_blocked_scale_must_fit():
    x = np.zeros((2, 8), np.float32)
    scale = const(np.ones((2, 3), np.float32))
    with pytest.raises(polyonnx.LoweringError, match=r"block_size 2 \(expected \[2, 4\]\)"):
        _lower("DequantizeLinear", [x.astype(np.uint8), scale], np.float32, 2, opset=21, axis=1,
               block_size=2)  # fmt: skip


def test_qlinear_conv_input_scale_must_be_a_scalar():
    x, w = np.zeros((1, 2, 5, 5), np.uint8), np.zeros((3, 2, 3, 3), np.uint8)
    s, z = np.float32(1), np.uint8(0)
    with pytest.raises(polyonnx.LoweringError, match=r"input 1 must be a scalar"):
        _lower("QLinearConv", [x, np.ones(2, np.float32), z, w, s, z, s, z], np.uint8, 4,
               opset=10)  # fmt: skip


def test_dequantize_of_the_conformance_uint8_case_matches_exactly():
    x = np.array([0, 3, 128, 255], np.uint8)
    got = run_node("DequantizeLinear", [x, np.float32(2), np.uint8(128)],
                   [np.zeros(4, np.float32)], opset=13)[0]  # fmt: skip
    assert_matches(got, np.array([-256, -250, 0, 254], np.float32))
