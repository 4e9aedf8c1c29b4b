"""Activation and math lowerings (polyonnx/krnl/ops/activation.py) against numpy in float64,
with hypothesis-drawn shapes and attributes; accuracy sweeps of the inverse trigonometric
and hyperbolic functions; Hardmax, CastLike and BitwiseNot."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import LoweringError, ModelError
from tests.helpers import (
    MATH_TOL,
    OPSET,
    axis_of,
    check_node,
    const,
    fast,
    random_array,
    run_node,
    seeds,
    shapes,
)

_erf = np.vectorize(math.erf, otypes=[np.float64])
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def _softplus(x):
    return np.logaddexp(0, x)


# op → (reference on float64 given the attributes, attribute strategies)
ACTIVATIONS = {
    "Elu": (lambda x, alpha=1.0: np.where(x < 0, alpha * np.expm1(x), x), {"alpha": (0.1, 3)}),
    "Selu": (
        lambda x, alpha=SELU_ALPHA, gamma=SELU_GAMMA: np.where(
            x > 0, gamma * x, gamma * alpha * np.expm1(x)
        ),
        {"alpha": (0.5, 2), "gamma": (0.5, 2)},
    ),
    "Celu": (
        lambda x, alpha=1.0: np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha)),
        {"alpha": (0.25, 3)},
    ),
    "HardSigmoid": (
        lambda x, alpha=0.2, beta=0.5: np.clip(alpha * x + beta, 0, 1),
        {"alpha": (-1, 1), "beta": (-1, 1)},
    ),
    "HardSwish": (lambda x: x * np.clip(x / 6 + 0.5, 0, 1), {}),
    "Softsign": (lambda x: x / (1 + np.abs(x)), {}),
    "Mish": (lambda x: x * np.tanh(_softplus(x)), {}),
    "ThresholdedRelu": (lambda x, alpha=1.0: np.where(x > alpha, x, 0), {"alpha": (-2, 2)}),
    "Shrink": (
        lambda x, bias=0.0, lambd=0.5: np.where(
            x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)
        ),
        {"bias": (-1, 1), "lambd": (0, 2)},
    ),
}


NEWER = {"Mish": 18}  # ops newer than the helpers' default opset


def _f32(lo: float, hi: float):
    return st.floats(lo, hi).map(lambda v: float(np.float32(v)))


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
@fast(8)
@given(shape=shapes(), seed=seeds, data=st.data())
def test_activation_float32(op, shape, seed, data):
    ref, ranges = ACTIVATIONS[op]
    attrs = {k: data.draw(st.one_of(st.none(), _f32(*r)), label=k) for k, r in ranges.items()}
    attrs = {k: v for k, v in attrs.items() if v is not None}
    x = random_array(np.random.default_rng(seed), shape, np.float32, -8, 8)
    want = ref(x.astype(np.float64), **{k: float(np.float32(v)) for k, v in attrs.items()})
    check_node(op, [x], want.astype(np.float32), tol=MATH_TOL, opset=NEWER.get(op, OPSET), **attrs)


@pytest.mark.parametrize("op", ["Elu", "Selu", "Celu", "HardSwish", "Mish", "Softsign"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_activation_other_floats(op, dtype):
    """float64 keeps double accuracy; float16 is computed in float32 and rounded once."""
    ref = ACTIVATIONS[op][0]
    x = random_array(np.random.default_rng(1), (5, 33), dtype, -8, 8)
    want = ref(x.astype(np.float64)).astype(dtype)
    tol = {"rtol": 1e-13, "atol": 1e-15} if dtype == np.float64 else {"rtol": 1e-3, "atol": 1e-4}
    check_node(op, [x], want, tol=tol, opset=NEWER.get(op, OPSET))


@pytest.mark.parametrize("approximate", [None, "none", "tanh"])
@fast(6)
@given(shape=shapes(), seed=seeds)
def test_gelu(approximate, shape, seed):
    x = random_array(np.random.default_rng(seed), shape, np.float32, -6, 6).astype(np.float64)
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        want = 0.5 * x * (1 + np.tanh(inner))
    else:
        want = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    attrs = {} if approximate is None else {"approximate": approximate}
    check_node("Gelu", [x.astype(np.float32)], want.astype(np.float32), tol=MATH_TOL, opset=20,
               **attrs)  # fmt: skip


def test_gelu_rejects_an_unknown_approximation():
    x = np.zeros(3, np.float32)
    with pytest.raises(LoweringError, match="approximate"):
        run_node("Gelu", [x], [x], opset=20, approximate="erf")


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_shrink_integers_truncate_like_the_reference(dtype):
    x = random_array(np.random.default_rng(0), (7, 13), dtype, 0 if dtype == np.uint8 else -9, 9)
    xf = x.astype(np.float64)
    want = np.where(xf < -1.5, xf + 0.5, np.where(xf > 1.5, xf - 0.5, 0)).astype(dtype)
    check_node("Shrink", [x], want, bias=0.5, lambd=1.5)


@pytest.mark.parametrize("op", ["Elu", "Mish", "Atan", "HardSigmoid"])
def test_float_ops_refuse_integers(op):
    x = np.zeros(3, np.int32)
    with pytest.raises(LoweringError, match="only float16, float32 and float64"):
        run_node(op, [x], [x], opset=NEWER.get(op, OPSET))


# ---- trigonometric and hyperbolic ----------------------------------------------------

MATH = {
    "Tan": (np.tan, (-1.5, 1.5)),
    "Asin": (np.arcsin, (-1, 1)),
    "Acos": (np.arccos, (-1, 1)),
    "Atan": (np.arctan, (-50, 50)),
    "Sinh": (np.sinh, (-89, 89)),
    "Cosh": (np.cosh, (-89, 89)),
    "Asinh": (np.arcsinh, (-1e5, 1e5)),
    "Acosh": (np.arccosh, (1, 1e5)),
    "Atanh": (np.arctanh, (-1, 1)),
}
# max error in ulps of the result's format, as measured, with headroom
ULPS = {np.float32: 3.5, np.float64: 4.0}


def _sweep(op: str, dtype, rng: np.random.Generator) -> np.ndarray:
    """Uniform points over the op's range, plus log-uniform small magnitudes and the
    endpoints (for Acosh: 1 + log-uniform offsets)."""
    lo, hi = MATH[op][1]
    tiny = -30 if dtype == np.float32 else -300
    small = 10.0 ** rng.uniform(tiny, 0, 20_000) * rng.choice([-1, 1], 20_000)
    x = np.concatenate([rng.uniform(lo, hi, 80_000), small * max(abs(lo), abs(hi)), [lo, hi]])
    if op == "Acosh":
        x = 1 + np.abs(x - 1)
    return np.clip(x, lo, hi).astype(dtype)


@pytest.mark.parametrize("op", sorted(MATH))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_math_accuracy(op, dtype):
    ref = MATH[op][0]
    x = _sweep(op, dtype, np.random.default_rng(7))
    want = ref(x.astype(np.float64))
    (got,) = run_node(op, [x], [want.astype(dtype)])
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(dtype).tiny)
    spacing = np.spacing(np.abs(want[normal]).astype(dtype)).astype(np.float64)
    ulps = np.abs(got[normal].astype(np.float64) - want[normal]) / spacing
    assert ulps.max() <= ULPS[dtype], f"{op} {np.dtype(dtype).name}: {ulps.max():.2f} ulp"
    np.testing.assert_allclose(got[~normal], want[~normal].astype(dtype), rtol=0, atol=1e-37)


SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-30, 1e30]


@pytest.mark.parametrize("op", sorted(MATH))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_math_special_values(op, dtype):
    """NaN, ±inf, ±0, the domain edges ±1 and out-of-domain inputs (NaN) as numpy says."""
    x = np.array(SPECIALS, dtype)
    with np.errstate(all="ignore"):
        want = MATH[op][0](x.astype(np.float64)).astype(dtype)
    if op == "Tan":  # tan of ±1e30 has no meaningful float answer without a full reduction
        x, want = x[:-1], want[:-1]
    check_node(op, [x], want, tol={"rtol": 4e-7 if dtype == np.float32 else 5e-16, "atol": 0})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sinh_cosh_near_overflow(dtype):
    """exp(|x|) overflows before sinh/cosh do: the last stretch is exp(|x| - 2) * e^2/2."""
    top = 89.41 if dtype == np.float32 else 710.47
    start = 85 if dtype == np.float32 else 705
    x = np.linspace(start, top, 501).astype(dtype)
    x = np.concatenate([x, -x, [top + 0.1, -(top + 0.1)]]).astype(dtype)
    for op, ref in (("Sinh", np.sinh), ("Cosh", np.cosh)):
        with np.errstate(over="ignore"):
            want = ref(x.astype(np.float64)).astype(dtype)
        check_node(op, [x], want, tol={"rtol": 4e-7 if dtype == np.float32 else 1e-15})


@pytest.mark.parametrize("op", sorted(MATH))
def test_math_float16(op):
    lo, hi = MATH[op][1]
    hi = min(hi, 10.0) if op in ("Sinh", "Cosh") else min(hi, 1e4)
    lo = max(lo, -10.0) if op in ("Sinh", "Cosh") else max(lo, -1e4)
    x = np.random.default_rng(3).uniform(lo, hi, 300).astype(np.float16)
    want = MATH[op][0](x.astype(np.float64)).astype(np.float16)
    check_node(op, [x], want, tol={"rtol": 1e-3, "atol": 1e-4})


# ---- BitwiseNot, CastLike ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                   np.int64, np.uint64])  # fmt: skip
def test_bitwise_not(dtype):
    info = np.iinfo(dtype)
    x = np.random.default_rng(0).integers(info.min, info.max, (3, 17), dtype, endpoint=True)
    check_node("BitwiseNot", [x], np.invert(x), opset=18)


def test_bitwise_not_refuses_floats():
    x = np.zeros(3, np.float32)
    with pytest.raises(LoweringError, match="integer"):
        run_node("BitwiseNot", [x], [x], opset=18)


PAIRS = [(np.float32, np.float64), (np.float64, np.float32), (np.float32, np.float16),
         (np.float16, np.float32), (np.float32, np.int32), (np.int64, np.float32),
         (np.int32, np.bool_), (np.bool_, np.float32), (np.uint8, np.int64)]  # fmt: skip


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("like_is_constant", [False, True])
def test_cast_like(src, dst, like_is_constant):
    rng = np.random.default_rng(0)
    x = random_array(rng, (4, 19), src, 0 if dst == np.uint8 else -100, 100)
    like = np.zeros((2,), dst)
    check_node("CastLike", [x, const(like) if like_is_constant else like], x.astype(dst),
               opset=15)  # fmt: skip


# ---- Hardmax -------------------------------------------------------------------------


def _hardmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """1 at the first argmax (numpy's, so the first NaN wins) over the flattened ``axes``."""
    moved = np.moveaxis(x, axes, range(x.ndim - len(axes), x.ndim))
    rows = moved.reshape(*moved.shape[: x.ndim - len(axes)], -1)
    hot = np.zeros_like(rows)
    np.put_along_axis(hot, np.argmax(rows, axis=-1)[..., None], 1, axis=-1)
    return np.moveaxis(hot.reshape(moved.shape), range(x.ndim - len(axes), x.ndim), axes)


@fast(15)
@given(
    shape=shapes(1, 4), seed=seeds, data=st.data(), dtype=st.sampled_from([np.float32, np.float64])
)
def test_hardmax_opset13(shape, seed, data, dtype):
    """One axis; small integer values, so ties are common and the first maximum must win."""
    axis = data.draw(st.one_of(st.none(), axis_of(len(shape))))
    x = random_array(np.random.default_rng(seed), shape, np.int32, -2, 2).astype(dtype)
    attrs = {} if axis is None else {"axis": axis}
    want = _hardmax(x, ((-1 if axis is None else axis) % len(shape),))
    check_node("Hardmax", [x], want, opset=13, **attrs)


@fast(12)
@given(shape=shapes(1, 4), seed=seeds, data=st.data())
def test_hardmax_opset11_coerces_to_2d(shape, seed, data):
    """Before opset 13, every dim from ``axis`` on is one row (axis may equal the rank)."""
    rank = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-rank, rank)))
    x = random_array(np.random.default_rng(seed), shape, np.int32, -2, 2).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    start = 1 if axis is None else axis % rank if axis < 0 else axis
    want = _hardmax(x, tuple(range(min(start, rank), rank)))
    check_node("Hardmax", [x], want, opset=11, **attrs)


def test_hardmax_nan_counts_as_the_maximum():
    x = np.array([[1, np.nan, 5, np.nan], [3, 7, 7, 2], [np.nan] * 4], np.float32)
    check_node("Hardmax", [x], _hardmax(x, (1,)), opset=13)


def test_hardmax_refuses_an_axis_out_of_range():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ModelError, match=r"Hardmax node .*'axis' 2 is out of range"):
        run_node("Hardmax", [x], [x], opset=13, axis=2)
    with pytest.raises(ModelError, match=r"Hardmax node .*'axis' 3 is out of range"):
        run_node("Hardmax", [x], [x], opset=11, axis=3)


def test_hardmax_float16():
    x = random_array(np.random.default_rng(0), (3, 5, 17), np.float16)
    check_node("Hardmax", [x], _hardmax(x, (1,)), opset=13, axis=1)


def test_every_op_is_registered():
    from polyonnx.krnl.lower import supported_ops

    ops = {*ACTIVATIONS, *MATH, "Gelu", "Hardmax", "CastLike", "BitwiseNot"}
    assert ops <= supported_ops()
