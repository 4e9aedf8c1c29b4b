"""Normalisation lowerings (polyonnx/krnl/ops/norm.py) against float64 numpy references:
BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization,
RMSNormalization, MeanVarianceNormalization, LpNormalization and LRN."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import lower
from polyonnx.runtime.compiled import compile_graph, lower_model
from tests.helpers import (
    DIMS,
    MATH_TOL,
    assert_matches,
    axes_of,
    axis_of,
    check_node,
    const,
    fast,
    make_model,
    node_model,
    random_array,
    run_node,
    seeds,
    shapes,
    value_info,
)

TOL = {"rtol": 1e-4, "atol": 1e-4}
"""Normalised values are O(1); the statistics are float32 sums over up to ~10^4 terms."""

HALF_TOL = {"rtol": 5e-3, "atol": 5e-3}
SIZE = 6000
"""Drawn shapes are capped at this many elements, to keep each example quick."""

small_dims = st.sampled_from(DIMS[:7])


def channel_shapes(min_rank: int = 2, max_rank: int = 4):
    """(N, C, D1, …) shapes."""
    return shapes(min_rank, max_rank, SIZE)


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(a, np.float64) for a in arrays]


def _moments(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, np.float64)
    return x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)


def _program(model: onnx.ModelProto):
    return lower(load_graph(model))


# ---- BatchNormalization -----------------------------------------------------------------


def _batchnorm_ref(x, scale, bias, mean, var, eps):
    x, scale, bias, mean, var = _f64(x, scale, bias, mean, var)
    shape = (1, -1, *([1] * (x.ndim - 2))) if scale.ndim == 1 else (1, *scale.shape)
    s, b, m, v = (p.reshape(shape) for p in (scale, bias, mean, var))
    return s * (x - m) / np.sqrt(v + eps) + b


def _batchnorm_params(rng, shape, dtype=np.float32):
    scale, bias, mean = (random_array(rng, shape, dtype, -2, 2) for _ in range(3))
    var = random_array(rng, shape, dtype, 0, 3)
    return [scale, bias, mean, var]


@fast(20)
@given(
    shape=channel_shapes(),
    constant=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-2]),
    opset=st.sampled_from([7, 9, 14, 15, 17]),
    seed=seeds,
)
def test_batchnorm(shape, constant, eps, opset, seed):
    """Constant parameters (folded in numpy) and tensor parameters (folded in the
    kernel) give the same answer, in every opset."""
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    params = _batchnorm_params(rng, (shape[1],))
    expected = _batchnorm_ref(x, *params, eps).astype(np.float32)
    args = [x, *(const(p) if constant else p for p in params)]
    check_node("BatchNormalization", args, expected, tol=TOL, opset=opset, epsilon=eps)


def test_batchnorm_constant_parameters_fold_to_one_multiply_add():
    rng = np.random.default_rng(0)
    x = random_array(rng, (2, 5, 7, 3))
    params = _batchnorm_params(rng, (5,))
    model, _ = node_model("BatchNormalization", [x, *map(const, params)], [(np.float32, 4)])
    program = _program(model)
    (kernel,) = program.kernels
    assert len(kernel.statements) == 1
    scale = [name for name in program.constants if name.endswith(".bn_scale")]
    assert len(scale) == 1 and program.constants[scale[0]].shape == (5,)
    model, _ = node_model("BatchNormalization", [x, *params], [(np.float32, 4)])
    assert len(_program(model).kernels[0].statements) == 3  # scale, shift, y


@pytest.mark.parametrize("constant", [True, False])
def test_batchnorm_opset7_per_activation(constant):
    """Opset 7's spatial=0: parameters of shape (C, D1, …), broadcast over N only."""
    rng = np.random.default_rng(1)
    x = random_array(rng, (3, 4, 5, 2))
    params = _batchnorm_params(rng, (4, 5, 2))
    expected = _batchnorm_ref(x, *params, 1e-5).astype(np.float32)
    args = [x, *(const(p) if constant else p for p in params)]
    check_node("BatchNormalization", args, expected, tol=TOL, opset=7, spatial=0)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("constant", [True, False])
def test_batchnorm_dtypes(dtype, constant):
    rng = np.random.default_rng(2)
    x = random_array(rng, (2, 3, 17), dtype)
    params = _batchnorm_params(rng, (3,), dtype)
    expected = _batchnorm_ref(x, *params, 1e-5).astype(dtype)
    args = [x, *(const(p) if constant else p for p in params)]
    tol = HALF_TOL if dtype == np.float16 else TOL
    check_node("BatchNormalization", args, expected, tol=tol, opset=15)


def test_batchnorm_mixed_parameter_types():
    """Opset 15: scale/B (T1) and mean/var (T2) may differ from X's type."""
    rng = np.random.default_rng(3)
    x = random_array(rng, (2, 3, 5), np.float16)
    scale, bias, mean, var = _batchnorm_params(rng, (3,), np.float32)
    mean, var = mean.astype(np.float64), var.astype(np.float64)
    expected = _batchnorm_ref(x, scale, bias, mean, var, 1e-5).astype(np.float16)
    check_node("BatchNormalization", [x, scale, bias, mean, var], expected, tol=HALF_TOL, opset=15)


@pytest.mark.parametrize(("opset", "attrs", "outputs"), [(14, {"training_mode": 1}, 3),
                                                        (15, {"training_mode": 1}, 1),
                                                        (9, {}, 5), (7, {}, 5)])  # fmt: skip
def test_batchnorm_training_is_refused(opset, attrs, outputs):
    rng = np.random.default_rng(4)
    x = random_array(rng, (2, 3, 4))
    args = [x, *_batchnorm_params(rng, (3,))]
    shapes_ = [(np.float32, 3)] + [(np.float32, 1)] * (outputs - 1)
    model, feed = node_model("BatchNormalization", args, shapes_, opset=opset, **attrs)
    with pytest.raises(polyonnx.LoweringError, match="training mode"):
        polyonnx.InferenceSession(model).run(None, feed)


def test_batchnorm_wrong_parameter_shape_is_refused():
    rng = np.random.default_rng(5)
    x = random_array(rng, (2, 3, 4))
    params = _batchnorm_params(rng, (3,))
    params[0] = random_array(rng, (4,))
    with pytest.raises(polyonnx.PolyonnxError):
        run_node("BatchNormalization", [x, *map(const, params)], [x])


# ---- InstanceNormalization ---------------------------------------------------------------


@fast(15)
@given(shape=channel_shapes(), eps=st.sampled_from([1e-5, 0.5]), seed=seeds)
def test_instancenorm(shape, eps, seed):
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    scale, bias = random_array(rng, shape[1:2]), random_array(rng, shape[1:2])
    mean, var = _moments(x, tuple(range(2, len(shape))))
    sb = (1, -1, *([1] * (len(shape) - 2)))
    y = (x - mean) / np.sqrt(var + eps) * scale.reshape(sb) + bias.reshape(sb)
    check_node(
        "InstanceNormalization", [x, scale, bias], y.astype(np.float32), tol=TOL, epsilon=eps
    )


def test_instancenorm_float16_and_opset22():
    rng = np.random.default_rng(6)
    x = random_array(rng, (2, 3, 31), np.float16)
    scale, bias = random_array(rng, (3,), np.float16), random_array(rng, (3,), np.float16)
    mean, var = _moments(x, (2,))
    y = (x - mean) / np.sqrt(var + 1e-5) * scale.reshape(3, 1) + bias.reshape(3, 1)
    check_node(
        "InstanceNormalization", [x, scale, bias], y.astype(np.float16), tol=HALF_TOL, opset=22
    )


# ---- LayerNormalization ----------------------------------------------------------------


def _layernorm_ref(x, scale, bias, axis, eps, stash=np.float32):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean, var = _moments(x, axes)
    inv = 1 / np.sqrt(var + eps)
    y = (x - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype), mean.astype(stash), inv.astype(stash)


@st.composite
def layernorm_cases(draw):
    shape = draw(shapes(1, 4, SIZE))
    axis = draw(axis_of(len(shape)))
    normalized = shape[axis % len(shape) :]
    # Scale/B broadcast against the normalised shape: a suffix of it, some dims set to 1.
    rank = draw(st.integers(1, len(normalized)))
    ones = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
    tail = normalized[len(normalized) - rank :]
    pshape = tuple(1 if one else d for one, d in zip(ones, tail, strict=True))
    return shape, axis, pshape


@fast(25)
@given(
    case=layernorm_cases(),
    with_bias=st.booleans(),
    outputs=st.integers(1, 3),
    eps=st.sampled_from([1e-5, 0.1]),
    seed=seeds,
)
def test_layernorm(case, with_bias, outputs, eps, seed):
    shape, axis, pshape = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    scale = random_array(rng, pshape)
    bias = random_array(rng, pshape) if with_bias else None
    expected = _layernorm_ref(x, scale, bias, axis, eps)[:outputs]
    args = [x, scale] + ([bias] if with_bias else [])
    check_node("LayerNormalization", args, list(expected), tol=TOL, axis=axis, epsilon=eps)


def test_layernorm_only_inv_std_dev():
    """Mean absent ('') but InvStdDev requested."""
    rng = np.random.default_rng(7)
    x, scale = random_array(rng, (3, 17)), random_array(rng, (17,))
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"], axis=-1)
    model = make_model(
        [node],
        [value_info("x", np.float32, x.shape), value_info("s", np.float32, scale.shape)],
        [value_info("y", np.float32, [None] * 2), value_info("inv", np.float32, [None] * 2)],
    )
    y, inv = polyonnx.InferenceSession(model).run(None, {"x": x, "s": scale})
    want_y, _, want_inv = _layernorm_ref(x, scale, None, -1, 1e-5)
    assert_matches(y, want_y, TOL)
    assert_matches(inv, want_inv, TOL)


def test_layernorm_float64_stash():
    """stash_type=11 computes the statistics (and returns them) in float64."""
    rng = np.random.default_rng(8)
    x, scale = random_array(rng, (5, 33), np.float64), random_array(rng, (33,), np.float64)
    expected = list(_layernorm_ref(x, scale, None, 1, 1e-5, np.float64))
    tight = {"rtol": 1e-10, "atol": 1e-10}
    check_node("LayerNormalization", [x, scale], expected, tol=tight, axis=1, stash_type=11)


def test_layernorm_float16():
    rng = np.random.default_rng(9)
    x, scale = random_array(rng, (4, 31), np.float16), random_array(rng, (31,), np.float16)
    y, mean, inv = _layernorm_ref(x, scale, None, -1, 1e-5)
    check_node("LayerNormalization", [x, scale], [y, mean, inv], tol=HALF_TOL)


def test_layernorm_bad_stash_type_is_refused():
    rng = np.random.default_rng(10)
    x, scale = random_array(rng, (2, 3)), random_array(rng, (3,))
    with pytest.raises(polyonnx.LoweringError, match="stash_type"):
        run_node("LayerNormalization", [x, scale], [x], stash_type=7)


# ---- GroupNormalization ----------------------------------------------------------------


@st.composite
def group_cases(draw):
    groups = draw(st.sampled_from([1, 2, 3, 5]))
    per_group = draw(st.sampled_from([1, 2, 3]))
    spatial = draw(st.lists(small_dims, min_size=0, max_size=2))
    n = draw(st.sampled_from([1, 2, 3]))
    return (n, groups * per_group, *spatial), groups


def _groupnorm_ref(x, scale, bias, groups, eps):
    n, c = x.shape[:2]
    xg = np.asarray(x, np.float64).reshape(n, groups, -1)
    mean, var = _moments(xg, (2,))
    norm = ((xg - mean) / np.sqrt(var + eps)).reshape(x.shape)
    if scale.shape[0] != c:  # opset 18: one per group
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    sb = (1, c, *([1] * (x.ndim - 2)))
    return (norm * scale.reshape(sb) + bias.reshape(sb)).astype(x.dtype)


@fast(20)
@given(case=group_cases(), seed=seeds)
def test_groupnorm(case, seed):
    shape, groups = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    scale, bias = random_array(rng, shape[1:2]), random_array(rng, shape[1:2])
    expected = _groupnorm_ref(x, scale, bias, groups, 1e-5)
    check_node(
        "GroupNormalization", [x, scale, bias], expected, tol=TOL, opset=21, num_groups=groups
    )


@fast(8)
@given(case=group_cases(), seed=seeds)
def test_groupnorm_opset18_per_group_parameters(case, seed):
    """Opset 18's GroupNormalization (one scale and bias per group) is deprecated, so the
    ONNX checker refuses opset 18-20 models that use it; the lowering still implements
    it, which is checked here on a graph whose node is given opset 18 after loading."""
    shape, groups = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    scale, bias = random_array(rng, (groups,)), random_array(rng, (groups,))
    model, feed = node_model(
        "GroupNormalization", [x, scale, bias], [(np.float32, len(shape))], opset=21,
        num_groups=groups,
    )  # fmt: skip
    graph = load_graph(model)
    nodes = tuple(dataclasses.replace(n, opset=18) for n in graph.nodes)
    graph = dataclasses.replace(graph, nodes=nodes)
    (y,) = compile_graph(graph).run(feed).values()
    assert_matches(y, _groupnorm_ref(x, scale, bias, groups, 1e-5), TOL)


def test_groupnorm_float64_stash_and_epsilon():
    rng = np.random.default_rng(11)
    x = random_array(rng, (2, 6, 5, 3), np.float64)
    scale, bias = random_array(rng, (6,), np.float64), random_array(rng, (6,), np.float64)
    expected = _groupnorm_ref(x, scale, bias, 3, 0.25)
    tight = {"rtol": 1e-10, "atol": 1e-10}
    check_node("GroupNormalization", [x, scale, bias], expected, tol=tight, opset=21,
               num_groups=3, epsilon=0.25, stash_type=11)  # fmt: skip


def test_groupnorm_groups_must_divide_channels():
    rng = np.random.default_rng(12)
    x = random_array(rng, (1, 6, 4))
    scale, bias = random_array(rng, (6,)), random_array(rng, (6,))
    with pytest.raises(polyonnx.PolyonnxError, match="num_groups"):
        run_node("GroupNormalization", [x, scale, bias], [x], opset=21, num_groups=4)


# ---- RMSNormalization ------------------------------------------------------------------

needs_rms = pytest.mark.skipif(
    onnx.defs.onnx_opset_version() < 23, reason="this onnx has no RMSNormalization"
)


@needs_rms
@fast(15)
@given(case=layernorm_cases(), eps=st.sampled_from([1e-5, 0.1]), seed=seeds)
def test_rmsnorm(case, eps, seed):
    shape, axis, pshape = case
    rng = np.random.default_rng(seed)
    x, scale = random_array(rng, shape), random_array(rng, pshape)
    axes = tuple(range(axis % len(shape), len(shape)))
    ms = np.mean(np.asarray(x, np.float64) ** 2, axis=axes, keepdims=True)
    expected = (x / np.sqrt(ms + eps) * scale).astype(np.float32)
    check_node("RMSNormalization", [x, scale], expected, tol=TOL, opset=23, axis=axis, epsilon=eps)


# ---- MeanVarianceNormalization -----------------------------------------------------------


@fast(15)
@given(shape=shapes(1, 4, SIZE), data=st.data(), opset=st.sampled_from([9, 13]), seed=seeds)
def test_mvn(shape, data, opset, seed):
    axes = data.draw(axes_of(len(shape)))
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    mean, var = _moments(x, tuple(a % len(shape) for a in axes))
    expected = ((x - mean) / (np.sqrt(var) + 1e-9)).astype(np.float32)
    # x - mean loses the digits x and mean share: a float32 mean is off by about an ulp of
    # |x|, which is |x| / std of the output's unit (seed 495: two values 356 ulps apart).
    spread = np.max(np.abs(x) / (np.sqrt(var) + 1e-9))
    tol = {**TOL, "atol": TOL["atol"] + 16 * np.finfo(np.float32).eps * spread}
    check_node("MeanVarianceNormalization", [x], expected, tol=tol, opset=opset, axes=axes)


def test_mvn_default_axes():
    rng = np.random.default_rng(13)
    x = random_array(rng, (3, 5, 7, 2))
    mean, var = _moments(x, (0, 2, 3))
    expected = ((x - mean) / (np.sqrt(var) + 1e-9)).astype(np.float32)
    check_node("MeanVarianceNormalization", [x], expected, tol=TOL)


# ---- LpNormalization ---------------------------------------------------------------------


def _lp_ref(x, axis, p):
    x64 = np.asarray(x, np.float64)
    norm = np.sum(np.abs(x64) ** p, axis=axis, keepdims=True) ** (1 / p)
    safe = np.where(norm == 0, 1, norm)
    return np.where(norm == 0, 0, x64 / safe).astype(x.dtype)


@fast(15)
@given(shape=shapes(1, 4, SIZE), data=st.data(), p=st.sampled_from([1, 2]), seed=seeds)
def test_lpnorm(shape, data, p, seed):
    axis = data.draw(axis_of(len(shape)))
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    check_node("LpNormalization", [x], _lp_ref(x, axis, p), tol=TOL, axis=axis, p=p)


@pytest.mark.parametrize("p", [1, 2])
def test_lpnorm_zero_rows_are_zero(p):
    x = np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 0.0]], np.float32)
    check_node("LpNormalization", [x], _lp_ref(x, 1, p), tol=TOL, axis=1, p=p, opset=22)


def test_lpnorm_other_p_is_refused():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(polyonnx.PolyonnxError, match="p=3"):
        run_node("LpNormalization", [x], [x], p=3)


# ---- LRN ---------------------------------------------------------------------------------


def _lrn_ref(x, size, alpha, beta, bias):
    x64 = np.asarray(x, np.float64)
    c = x.shape[1]
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    square = np.zeros_like(x64)
    for ch in range(c):
        window = x64[:, max(0, ch - lo) : min(c, ch + hi + 1)]
        square[:, ch] = np.sum(window**2, axis=1)
    return (x64 / (bias + alpha / size * square) ** beta).astype(x.dtype)


@fast(20)
@given(
    shape=channel_shapes(3, 4),
    size=st.integers(1, 6),
    alpha=st.sampled_from([1e-4, 0.5]),
    beta=st.sampled_from([0.75, 0.5, 0.25, 1.0, 0.6]),
    bias=st.sampled_from([1.0, 2.0]),
    seed=seeds,
)
def test_lrn(shape, size, alpha, beta, bias, seed):
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape)
    expected = _lrn_ref(x, size, alpha, beta, bias)
    check_node("LRN", [x], expected, tol=MATH_TOL, size=size, alpha=alpha, beta=beta, bias=bias)


@pytest.mark.parametrize(("beta", "pow_"), [(0.75, False), (0.5, False), (0.6, True)])
def test_lrn_takes_square_roots_for_quarter_powers(beta, pow_):
    """base ** 0.75 as sqrt(base) * sqrt(sqrt(base)): pow would run exp and log in double."""
    x = np.zeros((1, 8, 5, 5), np.float32)
    model, _ = node_model("LRN", [x], [(np.float32, 4)], size=3, beta=beta)
    (kernel,) = lower_model(model).kernels
    assert ("'pow'" in repr(kernel.statements)) == pow_


def test_lrn_window_wider_than_channels():
    """size 7 over 3 channels: every window is clipped on both sides."""
    rng = np.random.default_rng(14)
    x = random_array(rng, (2, 3, 5, 4))
    check_node("LRN", [x], _lrn_ref(x, 7, 0.3, 0.75, 1.0), tol=MATH_TOL, size=7, alpha=0.3)


# ---- every op refuses integer inputs ------------------------------------------------------


def test_integer_input_is_refused():
    x = np.ones((2, 3, 4), np.int32)
    with pytest.raises(polyonnx.PolyonnxError):
        run_node("LpNormalization", [x], [x])


@pytest.mark.parametrize(
    ("op", "attrs", "match"),
    [
        ("LayerNormalization", {"axis": 2}, "'axis' 2 is out of range"),
        ("RMSNormalization", {"axis": -3, "opset": 23}, "axis -3 is out of range"),
        ("LpNormalization", {"axis": 5}, "'axis' 5 is out of range"),
        ("MeanVarianceNormalization", {"axes": [1, -1]}, r"'axes' \[1, -1\] repeats an axis"),
    ],
)
def test_bad_axes_are_refused(op, attrs, match):
    if op == "RMSNormalization" and onnx.defs.onnx_opset_version() < 23:
        pytest.skip("this onnx has no RMSNormalization")
    x = np.ones((2, 3), np.float32)
    args = [x] if op in ("LpNormalization", "MeanVarianceNormalization") else [x, x[0]]
    # PolyonnxError: the load-time validator does not check RMSNormalization's axis yet, so
    # that one is still refused by the lowering (a LoweringError); the others at load.
    with pytest.raises(polyonnx.PolyonnxError, match=f"{op} node .*{match}"):
        run_node(op, args, [x], **attrs)
