"""Elementwise lowerings (polyonnx/krnl/ops/elementwise.py) against numpy, with
hypothesis-drawn shapes and numpy-broadcast operand shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import polyonnx
from polyonnx.krnl.ops.elementwise import BINARY, COMPARE, UNARY
from tests.helpers import (
    FLOAT_TOL,
    MATH_TOL,
    assert_matches,
    broadcast_shapes,
    check_node,
    const,
    fast,
    make_model,
    node_model,
    random_array,
    seeds,
    shapes,
    sum_tol,
    value_info,
)

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f64(fn):
    """``fn`` evaluated in float64 and rounded back to the input's dtype."""
    return lambda x: fn(x.astype(np.float64)).astype(x.dtype)


# op → (reference, input range (low, high), tolerance); Not is on bools, the rest floats.
UNARY_CASES = {
    "Neg": (np.negative, (-4, 4), FLOAT_TOL),
    "Abs": (np.abs, (-4, 4), FLOAT_TOL),
    "Sqrt": (np.sqrt, (0, 100), FLOAT_TOL),
    "Exp": (_f64(np.exp), (-20, 20), MATH_TOL),
    "Log": (_f64(np.log), (1e-3, 1e3), MATH_TOL),
    "Tanh": (_f64(np.tanh), (-8, 8), MATH_TOL),
    "Sigmoid": (_f64(lambda x: 1 / (1 + np.exp(-x))), (-20, 20), MATH_TOL),
    "Erf": (_f64(_erf), (-4, 4), MATH_TOL),
    "Sin": (_f64(np.sin), (-10, 10), MATH_TOL),
    "Cos": (_f64(np.cos), (-10, 10), MATH_TOL),
    "Floor": (np.floor, (-8, 8), FLOAT_TOL),
    "Ceil": (np.ceil, (-8, 8), FLOAT_TOL),
    "Round": (np.round, (-8, 8), FLOAT_TOL),
    "Sign": (np.sign, (-2, 2), FLOAT_TOL),
    "Reciprocal": (np.reciprocal, (0.1, 10), FLOAT_TOL),
    "Not": (np.logical_not, (0, 1), FLOAT_TOL),
    "Softplus": (_f64(lambda x: np.logaddexp(0, x)), (-20, 20), MATH_TOL),
}


def test_every_unary_op_is_covered():
    assert set(UNARY_CASES) == set(UNARY)


def _unary_input(op: str, rng: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    low, high = UNARY_CASES[op][1]
    if op == "Not":
        return random_array(rng, shape, np.bool_)
    x = random_array(rng, shape, dtype, low, high)
    if op in ("Round", "Floor", "Ceil", "Sign") and x.size:
        # exact halves, integers and zeros: the cases rounding modes disagree on
        flat = x.reshape(-1)
        picks = rng.random(flat.size) < 0.5
        flat[picks] = np.round(flat[picks] * 2) / 2
    return x


@pytest.mark.parametrize("op", sorted(UNARY_CASES))
@fast(12)
@given(shape=shapes(), seed=seeds)
def test_unary_float32(op, shape, seed):
    ref, _, tol = UNARY_CASES[op]
    x = _unary_input(op, np.random.default_rng(seed), shape)
    check_node(op, [x], np.asarray(ref(x)), tol=tol)


@pytest.mark.parametrize(
    "op", ["Neg", "Abs", "Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Erf", "Sin", "Floor", "Round"]
)
@fast(6)
@given(shape=shapes(max_rank=2), seed=seeds)
def test_unary_float64(op, shape, seed):
    """Double precision keeps double accuracy (no float32 detour)."""
    ref, _, _ = UNARY_CASES[op]
    x = _unary_input(op, np.random.default_rng(seed), shape, np.float64)
    check_node(op, [x], np.asarray(ref(x)), tol={"rtol": 1e-12, "atol": 1e-14})


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@fast(8)
@given(shape=shapes(), seed=seeds)
def test_unary_int(op, dtype, shape, seed):
    ref = UNARY_CASES[op][0]
    x = random_array(np.random.default_rng(seed), shape, dtype, -100, 100)
    check_node(op, [x], ref(x))


def test_unary_special_values():
    """NaN and ±inf go through the non-transcendental unary ops as numpy says."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.5, -2.5, 0.5] * 3, np.float32)
    for op in ("Neg", "Abs", "Floor", "Ceil", "Round", "Sign"):
        check_node(op, [x], UNARY_CASES[op][0](x))


# ---- Relu, LeakyRelu, Clip -----------------------------------------------------------


@fast(15)
@given(shape=shapes(), seed=seeds, dtype=st.sampled_from([np.float32, np.int32]))
def test_relu(shape, seed, dtype):
    x = random_array(np.random.default_rng(seed), shape, dtype, -10, 10)
    check_node("Relu", [x], np.maximum(x, dtype(0)))


@fast(15)
@given(shape=shapes(), seed=seeds, alpha=st.one_of(st.none(), st.floats(-2, 2, width=32)))
def test_leaky_relu(shape, seed, alpha):
    x = random_array(np.random.default_rng(seed), shape)
    slope = np.float32(0.01 if alpha is None else alpha)
    attrs = {} if alpha is None else {"alpha": alpha}
    check_node("LeakyRelu", [x], np.where(x < 0, x * slope, x), **attrs)


bounds = st.one_of(st.none(), st.floats(-3, 3, width=32))


@pytest.mark.parametrize("opset", [6, 10])
@fast(10)
@given(shape=shapes(), seed=seeds, lo=bounds, hi=bounds)
def test_clip_attributes(opset, shape, seed, lo, hi):
    """Clip-6 (in force up to opset 10) takes min and max as attributes."""
    x = random_array(np.random.default_rng(seed), shape)
    attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
    expected = x
    if lo is not None:
        expected = np.maximum(expected, np.float32(lo))
    if hi is not None:
        expected = np.minimum(expected, np.float32(hi))
    check_node("Clip", [x], expected, opset=opset, **attrs)


@fast(20)
@given(
    shape=shapes(),
    seed=seeds,
    lo=bounds,
    hi=bounds,
    runtime=st.booleans(),
    dtype=st.sampled_from([np.float32, np.int32]),
)
def test_clip_opset13_inputs(shape, seed, lo, hi, runtime, dtype):
    """min and max as optional inputs: both, only min, only max (min given as ''), none;
    as compile-time constants or as run-time scalar inputs."""
    x = random_array(np.random.default_rng(seed), shape, dtype, -5, 5)
    expected = x

    def bound(v):
        if v is None:
            return None
        v = np.array(v, dtype)
        return v if runtime else const(v)

    if lo is not None:
        expected = np.maximum(expected, dtype(lo))
    if hi is not None:
        expected = np.minimum(expected, dtype(hi))
    args = [x, bound(lo), bound(hi)]
    while args[-1] is None:
        args.pop()
    check_node("Clip", args, expected, opset=13)


# ---- Cast ---------------------------------------------------------------------------

CAST_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8]


def _cast_source(rng: np.random.Generator, shape, src, dst) -> np.ndarray:
    src = np.dtype(src)
    if src == np.bool_:
        return random_array(rng, shape, np.bool_)
    if np.issubdtype(src, np.floating):
        # fractions of both signs (truncation toward zero), zeros (→ bool), and only values
        # that fit the target: converting an out-of-range float is undefined behaviour
        low = 0 if dst == np.uint8 else -120
        x = random_array(rng, shape, src, low, 120)
        if x.size:
            x.reshape(-1)[rng.random(x.size) < 0.2] = 0
        return x
    low = 0 if src == np.uint8 else -300
    return random_array(rng, shape, src, low, 300)  # int → uint8 / int32 wraps, as numpy


@pytest.mark.parametrize("src", CAST_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dst", CAST_DTYPES, ids=lambda d: np.dtype(d).name)
@fast(5)
@given(shape=shapes(), seed=seeds)
def test_cast(src, dst, shape, seed):
    x = _cast_source(np.random.default_rng(seed), shape, src, dst)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    check_node("Cast", [x], x.astype(dst), to=to)


def test_cast_float_to_int_truncates_toward_zero():
    x = np.array([-2.9, -2.5, -1.5, -0.7, -0.0, 0.3, 0.5, 1.5, 2.5, 2.9], np.float32)
    check_node("Cast", [x], np.array([-2, -2, -1, 0, 0, 0, 0, 1, 2, 2], np.int32), to=6)
    check_node("Cast", [x], x != 0, to=TensorProto.BOOL)


def test_cast_extreme_values():
    """Doubles beyond float32 range become ±inf, NaN stays NaN and is true as a bool;
    wide integers round to nearest in floats and wrap in narrower integers."""
    x = np.array([1e300, -1e300, np.nan, np.inf, 1e-300, -0.0, 3.5], np.float64)
    with np.errstate(over="ignore"):
        check_node("Cast", [x], x.astype(np.float32), to=TensorProto.FLOAT)
    check_node("Cast", [x], x.astype(np.bool_), to=TensorProto.BOOL)
    wide = np.array([2**62 + 1, -(2**53) - 1, 2**31 + 5, -(2**31) - 7, 2**24 + 1, 256, -1])
    for dst in (np.float32, np.float64, np.int32, np.uint8, np.bool_):
        to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
        check_node("Cast", [wide.astype(np.int64)], wide.astype(dst), to=to)


def _near_half_ties(rng: np.random.Generator, n: int) -> np.ndarray:
    """Doubles a hair off the midpoint of two float16 values, where rounding through
    float32 first would land on the tie and round to even instead."""
    half = rng.integers(0, 0x7BFF, n).astype(np.uint16).view(np.float16).astype(np.float64)
    ulp = np.spacing(half.astype(np.float16)).astype(np.float64)
    nudge = np.ldexp(ulp, -20) * rng.choice([-1.0, 1.0], n)
    return (half + ulp / 2 + nudge) * rng.choice([-1.0, 1.0], n)


@fast(10)
@given(seed=seeds, n=st.integers(1, 70))
def test_cast_double_to_half_rounds_once(seed, n):
    """float64 -> float16 runs through float32 (rounded to odd), so it rounds as numpy's
    direct conversion does: near ties, subnormals, overflow, infinities and NaN."""
    x = _near_half_ties(np.random.default_rng(seed), n)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e300, 65519.99, 65520.0, 3e-8, 5e-324]
    x = np.concatenate([x, special])
    with np.errstate(over="ignore"):
        check_node("Cast", [x], x.astype(np.float16), tol={"rtol": 0, "atol": 0}, to=10)


@pytest.mark.parametrize("src", [TensorProto.FLOAT16, TensorProto.FLOAT])
@pytest.mark.parametrize(
    "dst", [TensorProto.UINT2, TensorProto.INT2, TensorProto.UINT4, TensorProto.INT4]
)
def test_cast_negative_floats_into_small_integers_match_the_reference(src, dst):
    """-3.0 -> int2 is 0 and -1.0 -> int2 is -1, as onnx.reference computes it (truncate,
    then 0 outside the range). Through a uint8 register the conversion of a negative float
    was poison: 0 on AVX2."""
    from onnx.reference import ReferenceEvaluator

    x = np.array([-7.9, -3, -2, -1, -0.5, 0, 1, 2, 3, 5, 9], helper.tensor_dtype_to_np_dtype(src))
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=dst)],
        "cast",
        [helper.make_tensor_value_info("x", src, x.shape)],
        [helper.make_tensor_value_info("y", dst, x.shape)],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 25)])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = polyonnx.InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(got.astype(np.int8), want.astype(np.int8))


# ---- binary ops with broadcasting ---------------------------------------------------

# op → (numpy reference, dtypes to test)
BINARY_CASES = {
    "Add": (np.add, [np.float32, np.float16, np.int32, np.int64]),
    "Sub": (np.subtract, [np.float32, np.float16, np.int32, np.int64]),
    "Mul": (np.multiply, [np.float32, np.float16, np.int32, np.int64]),
    "Div": (None, [np.float32, np.float64, np.int32, np.int64]),
    "Pow": (None, [np.float32]),
    "And": (np.logical_and, [np.bool_]),
    "Or": (np.logical_or, [np.bool_]),
    "Xor": (np.logical_xor, [np.bool_]),
    "BitwiseAnd": (np.bitwise_and, [np.int32, np.uint8, np.int64]),
    "BitwiseOr": (np.bitwise_or, [np.int32, np.uint8, np.int64]),
    "BitwiseXor": (np.bitwise_xor, [np.int32, np.uint8, np.int64]),
}
COMPARE_CASES = {
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
}
BITWISE_OPSET = 18


def test_every_binary_op_is_covered():
    assert set(BINARY_CASES) == set(BINARY)
    assert set(COMPARE_CASES) == set(COMPARE)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):  # C division: truncation toward zero
        return (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(a.dtype)
    return a / b


def _binary_operands(op, rng, shapes_ab, dtype):
    sa, sb = shapes_ab
    if op == "Pow":
        return random_array(rng, sa, dtype, 0.1, 4), random_array(rng, sb, dtype, -3, 3)
    a = random_array(rng, sa, dtype, -50, 50)
    b = random_array(rng, sb, dtype, -50, 50)
    if op == "Div":
        b = np.where(b == 0, dtype(7), b).astype(dtype)  # no integer division by zero
        if np.issubdtype(np.dtype(dtype), np.floating):
            b = np.where(np.abs(b) < 0.5, dtype(0.5), b).astype(dtype)
    return a, b


@pytest.mark.parametrize(
    ("op", "dtype"),
    [(op, d) for op, (_, dts) in BINARY_CASES.items() for d in dts],
    ids=lambda v: v if isinstance(v, str) else np.dtype(v).name,
)
@fast(12)
@given(shapes_ab=broadcast_shapes(2), seed=seeds, b_const=st.booleans())
def test_binary_broadcast(op, dtype, shapes_ab, seed, b_const):
    """b is a run-time input or an initializer (a literal when it has one element)."""
    a, b = _binary_operands(op, np.random.default_rng(seed), shapes_ab, dtype)
    args = [a, const(b) if b_const else b]
    if op == "Pow":
        expected = np.power(a.astype(np.float64), b).astype(dtype)
        check_node(op, args, expected, tol=MATH_TOL)
        return
    ref = _div if op == "Div" else BINARY_CASES[op][0]
    opset = BITWISE_OPSET if op.startswith("Bitwise") else 17
    check_node(op, args, np.asarray(ref(a, b)), opset=opset)


@fast(10)
@given(shapes_ab=broadcast_shapes(2), seed=seeds, exp_dtype=st.sampled_from([np.int32, np.int64]))
def test_pow_float_base_integer_exponent(shapes_ab, seed, exp_dtype):
    rng = np.random.default_rng(seed)
    a = random_array(rng, shapes_ab[0], np.float32, -3, 3)
    b = random_array(rng, shapes_ab[1], exp_dtype, -3, 4)
    expected = np.power(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    check_node("Pow", [a, b], expected, tol=MATH_TOL)


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=lambda d: d.__name__)
@fast(10)
@given(shapes_ab=broadcast_shapes(2), seed=seeds)
def test_pow_integer_base(dtype, shapes_ab, seed):
    """Integer powers are exact (no rounding error from the float detour)."""
    rng = np.random.default_rng(seed)
    a = random_array(rng, shapes_ab[0], dtype, -9, 9)
    b = random_array(rng, shapes_ab[1], dtype, 0, 7)
    check_node("Pow", [a, b], np.power(a, b))


@pytest.mark.parametrize("op", sorted(COMPARE_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8], ids=lambda d: d.__name__)
@fast(10)
@given(shapes_ab=broadcast_shapes(2), seed=seeds)
def test_compare_broadcast(op, dtype, shapes_ab, seed):
    rng = np.random.default_rng(seed)
    # few distinct values, so that ties (the case eq/le/ge differ on) are common
    a = random_array(rng, shapes_ab[0], dtype, 0, 4)
    b = random_array(rng, shapes_ab[1], dtype, 0, 4)
    if dtype == np.float32:
        a, b = np.floor(a) - 1, np.floor(b) - 1
    check_node(op, [a, b], COMPARE_CASES[op](a, b))


def test_compare_nan():
    a = np.array([np.nan, 1, np.nan, np.inf, -np.inf], np.float32)
    b = np.array([np.nan, np.nan, 1, np.inf, 0], np.float32)
    for op, ref in COMPARE_CASES.items():
        check_node(op, [a, b], ref(a, b))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64], ids=lambda d: d.__name__)
@fast(8)
@given(shapes_ab=broadcast_shapes(2), seed=seeds)
def test_bitshift(direction, dtype, shapes_ab, seed):
    rng = np.random.default_rng(seed)
    bits = np.dtype(dtype).itemsize * 8
    x = random_array(rng, shapes_ab[0], dtype, 0, 255)
    amount = random_array(rng, shapes_ab[1], dtype, 0, bits + 3)
    # shifting by the width or more shifts every bit out (LLVM would give poison)
    safe = np.minimum(amount, bits - 1).astype(dtype)
    shifted = np.left_shift(x, safe) if direction == "LEFT" else np.right_shift(x, safe)
    expected = np.where(amount >= bits, dtype(0), shifted).astype(dtype)
    check_node("BitShift", [x, amount], expected, direction=direction)


# ---- Mod ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("fmod", [0, 1])
@fast(12)
@given(shapes_ab=broadcast_shapes(2), seed=seeds)
def test_mod_int(dtype, fmod, shapes_ab, seed):
    """fmod=0: the result has the divisor's sign (Python); fmod=1: the dividend's (C)."""
    rng = np.random.default_rng(seed)
    a = random_array(rng, shapes_ab[0], dtype, -40, 40)
    b = random_array(rng, shapes_ab[1], dtype, -9, 9)
    b = np.where(b == 0, dtype(5), b).astype(dtype)
    expected = np.fmod(a, b) if fmod else np.mod(a, b)
    check_node("Mod", [a, b], expected, fmod=fmod)


def test_mod_int_signs():
    a = np.array([7, -7, 7, -7, 6, -6, 0], np.int32)
    b = np.array([3, 3, -3, -3, 3, -3, -3], np.int32)
    check_node("Mod", [a, b], np.array([1, 2, -2, -1, 0, 0, 0], np.int32))
    check_node("Mod", [a, b], np.array([1, -1, 1, -1, 0, 0, 0], np.int32), fmod=1)


@fast(12)
@given(shapes_ab=broadcast_shapes(2), seed=seeds)
def test_mod_float_fmod(shapes_ab, seed):
    rng = np.random.default_rng(seed)
    a = random_array(rng, shapes_ab[0], np.float32, -20, 20)
    b = random_array(rng, shapes_ab[1], np.float32, -5, 5)
    b = np.where(np.abs(b) < 0.25, np.float32(1.5), b).astype(np.float32)
    check_node("Mod", [a, b], np.fmod(a, b), fmod=1)


@fast(12)
@given(shapes_ab=broadcast_shapes(2), seed=seeds)
def test_mod_float_python_sign(shapes_ab, seed):
    """fmod=0 on floats (which ONNX leaves undefined) takes the divisor's sign, as np.mod."""
    rng = np.random.default_rng(seed)
    a = random_array(rng, shapes_ab[0], np.float32, -20, 20)
    b = random_array(rng, shapes_ab[1], np.float32, -5, 5)
    b = np.where(np.abs(b) < 0.25, np.float32(-1.5), b).astype(np.float32)
    check_node("Mod", [a, b], np.mod(a, b))


# ---- variadic, Where, PRelu ---------------------------------------------------------

VARIADIC = {
    "Max": lambda xs: np.maximum.reduce(np.broadcast_arrays(*xs)),
    "Min": lambda xs: np.minimum.reduce(np.broadcast_arrays(*xs)),
    "Sum": lambda xs: np.add.reduce(np.broadcast_arrays(*xs)),
    "Mean": lambda xs: np.add.reduce(np.broadcast_arrays(*xs)) / len(xs),
}


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        (op, d)
        for op in sorted(VARIADIC)
        for d in (np.float32, np.int32)
        if (op, d) != ("Mean", np.int32)
    ],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
@fast(12)
@given(data=st.data(), seed=seeds)
def test_variadic(op, dtype, data, seed):
    n = data.draw(st.integers(1, 3), label="n")
    input_shapes = data.draw(broadcast_shapes(n), label="shapes")
    rng = np.random.default_rng(seed)
    xs = [random_array(rng, s, dtype, -20, 20) for s in input_shapes]
    expected = np.asarray(VARIADIC[op](xs)).astype(dtype)
    check_node(op, xs, expected)


@pytest.mark.parametrize("op", ["Max", "Min"])
@fast(15)
@given(data=st.data(), seed=seeds)
def test_variadic_extremum_with_nan_and_inf(op, data, seed):
    """3 to 5 operands take one tree of plain compare-selects plus a NaN check two
    operands at a time (emit/ops.py:extremum): a NaN in any operand, at any position,
    still gives NaN, and infinities order as numbers."""
    n = data.draw(st.integers(3, 5), label="n")
    input_shapes = data.draw(broadcast_shapes(n), label="shapes")
    rng = np.random.default_rng(seed)
    xs = [random_array(rng, s, np.float32, -20, 20) for s in input_shapes]
    for x in xs:
        if x.size:
            flat = x.reshape(-1)
            picks = rng.integers(0, x.size, size=rng.integers(0, 3))
            flat[picks] = rng.choice([np.nan, np.inf, -np.inf], size=len(picks))
    check_node(op, xs, np.asarray(VARIADIC[op](xs)).astype(np.float32))


@fast(20)
@given(
    input_shapes=broadcast_shapes(3),
    seed=seeds,
    dtype=st.sampled_from([np.float32, np.int64, np.bool_]),
)
def test_where_three_way_broadcast(input_shapes, seed, dtype):
    rng = np.random.default_rng(seed)
    cond = random_array(rng, input_shapes[0], np.bool_)
    x = random_array(rng, input_shapes[1], dtype)
    y = random_array(rng, input_shapes[2], dtype)
    check_node("Where", [cond, x, y], np.where(cond, x, y))


@st.composite
def prelu_shapes(draw):
    """x and a slope that broadcasts to x (unidirectionally)."""
    x = draw(shapes(min_rank=1))
    rank = draw(st.integers(0, len(x)))
    ones = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
    slope = tuple(1 if one else d for one, d in zip(ones, x[len(x) - rank :], strict=True))
    return x, slope


@fast(20)
@given(xs=prelu_shapes(), seed=seeds)
def test_prelu(xs, seed):
    rng = np.random.default_rng(seed)
    x = random_array(rng, xs[0])
    slope = random_array(rng, xs[1], np.float32, -1, 1)
    check_node("PRelu", [x, slope], np.where(x < 0, x * slope, x).astype(np.float32))


# ---- IsNaN, IsInf ---------------------------------------------------------------------


def _with_specials(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    x = random_array(rng, shape, dtype)
    if x.size:
        flat = x.reshape(-1)
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype)
        picks = rng.random(flat.size) < 0.4
        flat[picks] = rng.choice(specials, size=int(picks.sum()))
    return x


@fast(12)
@given(shape=shapes(), seed=seeds, dtype=st.sampled_from([np.float32, np.float64]))
def test_isnan(shape, seed, dtype):
    x = _with_specials(np.random.default_rng(seed), shape, dtype)
    check_node("IsNaN", [x], np.isnan(x))


@pytest.mark.parametrize(("pos", "neg"), [(1, 1), (1, 0), (0, 1), (0, 0)])
@fast(8)
@given(shape=shapes(), seed=seeds, dtype=st.sampled_from([np.float32, np.float64]))
def test_isinf(pos, neg, shape, seed, dtype):
    x = _with_specials(np.random.default_rng(seed), shape, dtype)
    expected = (np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))
    check_node("IsInf", [x], expected, detect_positive=pos, detect_negative=neg)


# ---- chains of elementwise nodes, against onnxruntime ---------------------------------


def _chain_model(sa, sb, sc):
    """((a + b) * 0.5 - c) → Relu → Div by (|c| + 1) → Neg → Max with a: four
    intermediates, three broadcast inputs and a scalar constant."""
    nodes = [
        helper.make_node("Add", ["a", "b"], ["t0"]),
        helper.make_node("Mul", ["t0", "half"], ["t1"]),
        helper.make_node("Sub", ["t1", "c"], ["t2"]),
        helper.make_node("Relu", ["t2"], ["t3"]),
        helper.make_node("Abs", ["c"], ["t4"]),
        helper.make_node("Add", ["t4", "one"], ["t5"]),
        helper.make_node("Div", ["t3", "t5"], ["t6"]),
        helper.make_node("Neg", ["t6"], ["t7"]),
        helper.make_node("Max", ["t7", "a"], ["y"]),
    ]
    rank = max(len(sa), len(sb), len(sc))
    inputs = [value_info(n, np.float32, s) for n, s in (("a", sa), ("b", sb), ("c", sc))]
    constants = {"half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32)}
    return make_model(nodes, inputs, [value_info("y", np.float32, [None] * rank)], constants)


def assert_matches_onnxruntime(model, feed, tol=FLOAT_TOL):
    ort = pytest.importorskip("onnxruntime")
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feed)
    got = polyonnx.InferenceSession(model).run(None, feed)
    assert len(got) == len(expected)
    for actual, want in zip(got, expected, strict=True):
        assert_matches(actual, want, tol)


def test_chain_against_onnxruntime():
    rng = np.random.default_rng(0)
    feed = {
        "a": random_array(rng, (8, 1, 64)),
        "b": random_array(rng, (1, 32, 1)),
        "c": random_array(rng, ()),
    }
    model = _chain_model((8, 1, 64), (1, 32, 1), ())
    assert_matches_onnxruntime(model, feed)


@fast(15)
@given(input_shapes=broadcast_shapes(3), seed=seeds)
def test_chain_broadcast_against_onnxruntime(input_shapes, seed):
    rng = np.random.default_rng(seed)
    feed = {n: random_array(rng, s) for n, s in zip("abc", input_shapes, strict=True)}
    assert_matches_onnxruntime(_chain_model(*input_shapes), feed)


def test_diamond_graph_against_onnxruntime():
    """Intermediates used by several later nodes, of several sizes, three graph outputs
    (one also consumed): what the arena planner must keep alive is read back correctly."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["a"]),
        helper.make_node("Add", ["a", "x"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Sub", ["a", "c"], ["d"]),
        helper.make_node("MatMul", ["d", "w"], ["e"]),
        helper.make_node("ReduceMax", ["e"], ["f"], axes=[1], keepdims=1),
        helper.make_node("Sub", ["e", "f"], ["g"]),
        helper.make_node("Softmax", ["g"], ["h"], axis=-1),
        helper.make_node("Transpose", ["d"], ["dt"]),
        helper.make_node("MatMul", ["dt", "h"], ["i"]),
        helper.make_node("ReduceSum", ["i", "one"], ["j"], keepdims=0),
        helper.make_node("Unsqueeze", ["j", "zero"], ["k"]),
        helper.make_node("Add", ["c", "k"], ["y"]),
    ]
    constants = {
        "two": np.array(2, np.float32),
        "w": random_array(rng, (33, 31), np.float32, -1, 1),
        "one": np.array([1], np.int64),
        "zero": np.array([0], np.int64),
    }
    outputs = [
        value_info("y", np.float32, [31, 33]),
        value_info("e", np.float32, [31, 31]),
        value_info("i", np.float32, [33, 31]),
    ]
    x_info = [value_info("x", np.float32, [31, 33])]
    model = make_model(nodes, x_info, outputs, constants, opset=13)
    assert_matches_onnxruntime(model, {"x": random_array(rng, (31, 33))}, sum_tol(33))


def test_node_model_feeds_graph_inputs():
    """The helper's models exercise the lowering: plain arrays are graph inputs (not
    folded constants) and Const arrays are initializers."""
    x = np.ones((2, 3), np.float32)
    model, feed = node_model("Add", [x, const(np.float32(2))], [(np.float32, 2)])
    assert [i.name for i in model.graph.input] == ["x0"]
    assert [t.name for t in model.graph.initializer] == ["x1"]
    assert list(feed) == ["x0"]
    (y,) = polyonnx.InferenceSession(model).run(None, feed)
    assert_matches(y, x + 2)
