"""Activations and elementwise math composed from krnl scalar ops.

Every op here is one elementwise statement (:func:`elementwise`) whose body is written in
the IR from the primitives of :mod:`polyonnx.emit.mathfn` (exp, expm1, log, log1p, tanh,
softplus, erf, sin, cos), ``sqrt`` and arithmetic::

    Elu        x < 0 ? alpha*expm1(x) : x          Asin, Acos   reduced to |w| <= 1/2
    Gelu       x/2 * (1 + erf(x/sqrt 2))           Atan         reduced to |t| <= tan(pi/8)
    Sinh       (E + E/(E+1))/2, E = expm1|x|       Asinh        log1p(a + a^2/(1 + sqrt(1+a^2)))

float16 is computed in float32 and rounded once; float64 keeps double-precision
polynomials. Measured accuracy (tests/krnl/test_activation.py, 10^5 points per op over
its range plus log-uniform small magnitudes, numpy in float64 as the reference):

    op        float32           float64         op        float32           float64
    Tan       2.7 ulp, 1.8e-7   3 ulp, 4.4e-16  Sinh      2.0 ulp, 1.6e-7   2 ulp, 2.9e-16
    Asin      2.4 ulp, 2.7e-7   2 ulp, 4.2e-16  Cosh      1.5 ulp, 1.2e-7   1 ulp, 2.2e-16
    Acos      1.2 ulp, 1.2e-7   1 ulp, 2.2e-16  Asinh     1.4 ulp, 1.6e-7   2 ulp, 2.3e-16
    Atan      1.8 ulp, 1.4e-7   2 ulp, 2.6e-16  Acosh     1.7 ulp, 1.3e-7   1 ulp, 2.2e-16
                                                Atanh     2.1 ulp, 1.8e-7   2 ulp, 2.5e-16

(max error in units of the result's last place, and max relative error; the float64
figures include the reference's own rounding.)

Hardmax, CastLike and BitwiseNot live here too: they are elementwise in shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import DTYPES, Expr, Iter, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.elementwise import elementwise
from polyonnx.krnl.ops.reduce import Reduction, identity

Fn = Callable[[Expr], Expr]

# ---- expression shorthands ---------------------------------------------------------


def _k(value: float, like: Expr) -> Expr:
    return kb.const(value, like.dtype)


def _add(a: Expr, b: Expr) -> Expr:
    return kb.binary("add", a, b)


def _sub(a: Expr, b: Expr) -> Expr:
    return kb.binary("sub", a, b)


def _mul(a: Expr, b: Expr) -> Expr:
    return kb.binary("mul", a, b)


def _div(a: Expr, b: Expr) -> Expr:
    return kb.binary("div", a, b)


def _fn(op: str, x: Expr) -> Expr:
    return kb.unary(op, x)


def _cmp(op: str, a: Expr, b: Expr) -> Expr:
    return kb.binary(op, a, b, "bool")


def _sel(cond: Expr, a: Expr, b: Expr) -> Expr:
    return kb.select(cond, a, b)


def _horner(s: Expr, coeffs: tuple[float, ...]) -> Expr:
    """c0*s^(n-1) + ... + c(n-1), coefficients highest degree first."""
    acc = _k(coeffs[0], s)
    for c in coeffs[1:]:
        acc = _add(_mul(acc, s), _k(c, s))
    return acc


def _signed(y: Expr, x: Expr) -> Expr:
    """``y`` with the sign of ``x`` (for odd functions computed on |x|)."""
    return _mul(y, _sel(_cmp("lt", x, _k(0, x)), _k(-1, x), _k(1, x)))


# ---- lowering drivers --------------------------------------------------------------


def _float_op(ctx: LowerContext, node: Node, fn: Fn) -> None:
    """One float input through ``fn``; float16 goes through float32."""

    def body(xs: list[Expr]) -> Expr:
        x = xs[0]
        if not is_float(x.dtype):
            raise LoweringError(
                f"{node.op_type} node {node.name!r}: input has dtype {x.dtype}; "
                "only float16, float32 and float64 are supported"
            )
        if x.dtype == "float16":
            return kb.cast(fn(kb.cast(x, "float32")), "float16")
        return fn(x)

    elementwise(ctx, node, node.inputs[:1], body)


def _attr(node: Node, name: str, default: float) -> float:
    return float(node.attr(name, default))


# ---- activations -------------------------------------------------------------------


@lowers("Elu")
def lower_elu(ctx: LowerContext, node: Node) -> None:
    alpha = _attr(node, "alpha", 1.0)

    def fn(x: Expr) -> Expr:
        neg = _mul(_k(alpha, x), _fn("expm1", x))
        return _sel(_cmp("lt", x, _k(0, x)), neg, x)

    _float_op(ctx, node, fn)


SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


@lowers("Selu")
def lower_selu(ctx: LowerContext, node: Node) -> None:
    alpha, gamma = _attr(node, "alpha", SELU_ALPHA), _attr(node, "gamma", SELU_GAMMA)

    def fn(x: Expr) -> Expr:
        neg = _mul(_k(alpha * gamma, x), _fn("expm1", x))
        return _sel(_cmp("gt", x, _k(0, x)), _mul(_k(gamma, x), x), neg)

    _float_op(ctx, node, fn)


@lowers("Celu")
def lower_celu(ctx: LowerContext, node: Node) -> None:
    alpha = _attr(node, "alpha", 1.0)

    def fn(x: Expr) -> Expr:
        neg = _mul(_k(alpha, x), _fn("expm1", _div(x, _k(alpha, x))))
        return _add(kb.binary("max", x, _k(0, x)), kb.binary("min", neg, _k(0, x)))

    _float_op(ctx, node, fn)


def _hard_sigmoid(x: Expr, alpha: float, beta: float) -> Expr:
    lin = _add(_mul(_k(alpha, x), x), _k(beta, x))
    return kb.binary("max", kb.binary("min", lin, _k(1, x)), _k(0, x))


@lowers("HardSigmoid")
def lower_hard_sigmoid(ctx: LowerContext, node: Node) -> None:
    alpha, beta = _attr(node, "alpha", 0.2), _attr(node, "beta", 0.5)
    _float_op(ctx, node, lambda x: _hard_sigmoid(x, alpha, beta))


@lowers("HardSwish")
def lower_hard_swish(ctx: LowerContext, node: Node) -> None:
    _float_op(ctx, node, lambda x: _mul(x, _hard_sigmoid(x, 1 / 6, 0.5)))


@lowers("Softsign")
def lower_softsign(ctx: LowerContext, node: Node) -> None:
    _float_op(ctx, node, lambda x: _div(x, _add(_k(1, x), _fn("abs", x))))


@lowers("Mish")
def lower_mish(ctx: LowerContext, node: Node) -> None:
    _float_op(ctx, node, lambda x: _mul(x, _fn("tanh", _fn("softplus", x))))


@lowers("Gelu")
def lower_gelu(ctx: LowerContext, node: Node) -> None:
    approximate = node.attr("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        raise LoweringError(
            f"Gelu node {node.name!r}: approximate={approximate!r}; expected 'none' or 'tanh'"
        )

    def fn(x: Expr) -> Expr:
        if approximate == "tanh":
            cube = _mul(_k(0.044715, x), _mul(x, _mul(x, x)))
            inner = _mul(_k(math.sqrt(2 / math.pi), x), _add(x, cube))
            cdf = _add(_k(1, x), _fn("tanh", inner))
        else:
            cdf = _add(_k(1, x), _fn("erf", _mul(x, _k(math.sqrt(0.5), x))))
        return _mul(_mul(_k(0.5, x), x), cdf)

    _float_op(ctx, node, fn)


@lowers("ThresholdedRelu")
def lower_thresholded_relu(ctx: LowerContext, node: Node) -> None:
    alpha = _attr(node, "alpha", 1.0)
    _float_op(ctx, node, lambda x: _sel(_cmp("gt", x, _k(alpha, x)), x, _k(0, x)))


@lowers("Shrink")
def lower_shrink(ctx: LowerContext, node: Node) -> None:
    """x < -lambd: x + bias; x > lambd: x - bias; else 0. Integer inputs are computed in
    float64 and converted back (truncating), as the ONNX reference does."""
    bias, lambd = _attr(node, "bias", 0.0), _attr(node, "lambd", 0.5)

    def shrink(x: Expr) -> Expr:
        low = _sel(_cmp("lt", x, _k(-lambd, x)), _add(x, _k(bias, x)), _k(0, x))
        return _sel(_cmp("gt", x, _k(lambd, x)), _sub(x, _k(bias, x)), low)

    def body(xs: list[Expr]) -> Expr:
        x = xs[0]
        if x.dtype == "bool":
            raise LoweringError(f"Shrink node {node.name!r}: bool input is not supported")
        if x.dtype == "float16":
            return kb.cast(shrink(kb.cast(x, "float32")), "float16")
        if not is_float(x.dtype):
            return kb.cast(shrink(kb.cast(x, "float64")), x.dtype)
        return shrink(x)

    elementwise(ctx, node, node.inputs[:1], body)


# ---- trigonometric and hyperbolic ----------------------------------------------------


@dataclass(frozen=True)
class _Consts:
    """Per-format polynomials (fitted with mpmath.chebyfit, then rounded) and limits."""

    atan: tuple[float, ...]  # (atan t - t)/t^3 in s = t^2, |t| <= tan(pi/8)
    asin: tuple[float, ...]  # (asin w - w)/w^3 in z = w^2, |w| <= 1/2
    pio2: tuple[float, float]  # pi/2 = hi + lo
    pio4: tuple[float, float]
    pi: tuple[float, float]
    big: float  # asinh/acosh: above this, log(2a) is exact to the format
    exp_hi: float  # sinh/cosh: above this, exp(a) overflows: use exp(a/2)^2 / 2


_F32 = _Consts(
    atan=(-0.06451927870512009, 0.10743731260299683, -0.14263956248760223,
          0.19999539852142334, -0.3333333134651184),
    asin=(0.03808502480387688, 0.026554541662335396, 0.045001380145549774,
          0.07498855143785477, 0.16666673123836517),
    pio2=(1.5707963705062866, -4.371138828673793e-08),
    pio4=(0.7853981852531433, -2.1855694143368964e-08),
    pi=(3.1415927410125732, -8.742277657347586e-08),
    big=4096.0,
    exp_hi=88.0,
)  # fmt: skip
_F64 = _Consts(
    atan=(-0.01917688711906226, 0.03923165829558719, -0.0508544973794026,
          0.0585814891280221, -0.06664511447381948, 0.07692183190826087,
          -0.09090904578123903, 0.11111111015256361, -0.14285714284666542,
          0.1999999999999552, -0.3333333333333333),
    asin=(0.028757851367421566, -0.014851887071247204, 0.01740087944269402,
          0.005457506718640358, 0.01032281435018578, 0.011479177415184906,
          0.013971212973552933, 0.017352392720869973, 0.02237217294214989,
          0.030381944138531247, 0.04464285714635543, 0.07499999999998433,
          0.16666666666666669),
    pio2=(1.5707963267948966, 6.123233995736766e-17),
    pio4=(0.7853981633974483, 3.061616997868383e-17),
    pi=(3.141592653589793, 1.2246467991473532e-16),
    big=2.0**28,
    exp_hi=709.0,
)  # fmt: skip
TAN_PI_8 = math.tan(math.pi / 8)


def _consts(x: Expr) -> _Consts:
    return _F64 if x.dtype == "float64" else _F32


def _plus(hi: Expr, lo: Expr, scale: Expr, p: Expr) -> Expr:
    """hi + (lo + scale*p): a constant split in two parts plus a small term."""
    return _add(hi, _add(lo, _mul(scale, p)))


def _pick(cond: Expr, a: float, b: float, like: Expr) -> Expr:
    return _sel(cond, _k(a, like), _k(b, like))


def _atan(x: Expr) -> Expr:
    """atan x: a = |x|; r = 1/a if a > 1; t = (r-1)/(r+1) if r > tan(pi/8); then
    atan a = offset ± (t + t^3 P(t^2)) with offset in {0, pi/4, pi/2}."""
    c = _consts(x)
    a = _fn("abs", x)
    inv = _cmp("gt", a, _k(1, x))
    r = _sel(inv, _div(_k(1, x), a), a)
    mid = _cmp("gt", r, _k(TAN_PI_8, x))
    t = _sel(mid, _div(_sub(r, _k(1, x)), _add(r, _k(1, x))), r)
    s = _mul(t, t)
    p = _add(t, _mul(_mul(t, s), _horner(s, c.atan)))
    # inv and mid: pi/4 - p; inv: pi/2 - p; mid: pi/4 + p; neither: p
    hi = _sel(mid, _k(c.pio4[0], x), _pick(inv, c.pio2[0], 0, x))
    lo = _sel(mid, _k(c.pio4[1], x), _pick(inv, c.pio2[1], 0, x))
    return _signed(_plus(hi, lo, _pick(inv, -1, 1, x), p), x)


def _asin_core(a: Expr) -> tuple[Expr, Expr]:
    """For a = |x| <= 1: (big, p) with big = a > 1/2 and p = asin w, where w = a, or
    w = sqrt((1-a)/2) when big (then asin a = pi/2 - 2p). a > 1 gives NaN."""
    c = _consts(a)
    big = _cmp("gt", a, _k(0.5, a))
    z = _sel(big, _mul(_sub(_k(1, a), a), _k(0.5, a)), _mul(a, a))
    w = _sel(big, _fn("sqrt", z), a)
    return big, _add(w, _mul(_mul(w, z), _horner(z, c.asin)))


def _asin(x: Expr) -> Expr:
    c = _consts(x)
    big, p = _asin_core(_fn("abs", x))
    y = _plus(_pick(big, c.pio2[0], 0, x), _pick(big, c.pio2[1], 0, x), _pick(big, -2, 1, x), p)
    return _signed(y, x)


def _acos(x: Expr) -> Expr:
    """x > 1/2: 2p; x < -1/2: pi - 2p; else pi/2 - asin x."""
    c = _consts(x)
    big, p = _asin_core(_fn("abs", x))
    neg = _cmp("lt", x, _k(0, x))
    hi = _sel(big, _pick(neg, c.pi[0], 0, x), _k(c.pio2[0], x))
    lo = _sel(big, _pick(neg, c.pi[1], 0, x), _k(c.pio2[1], x))
    scale = _sel(big, _pick(neg, -2, 2, x), _pick(neg, 1, -1, x))
    return _plus(hi, lo, scale, p)


def _huge_half_exp(a: Expr) -> Expr:
    """exp(a)/2 for a near overflow, as exp(a - 2) * (e^2/2): a - 2 is exact there, and no
    intermediate overflows (exp(a/2)^2/2 would, once fast-math reassociates it)."""
    return _mul(_fn("exp", _sub(a, _k(2, a))), _k(math.exp(2) / 2, a))


def _sinh(x: Expr) -> Expr:
    a = _fn("abs", x)
    e = _fn("expm1", a)
    y = _mul(_k(0.5, x), _add(e, _div(e, _add(e, _k(1, x)))))
    return _signed(_sel(_cmp("gt", a, _k(_consts(x).exp_hi, x)), _huge_half_exp(a), y), x)


def _cosh(x: Expr) -> Expr:
    a = _fn("abs", x)
    e = _fn("expm1", a)
    small = _add(_k(1, x), _div(_mul(e, e), _mul(_k(2, x), _add(e, _k(1, x)))))
    ex = _fn("exp", a)
    mid = _add(_mul(_k(0.5, x), ex), _div(_k(0.5, x), ex))
    y = _sel(_cmp("gt", a, _k(_consts(x).exp_hi, x)), _huge_half_exp(a), mid)
    return _sel(_cmp("lt", a, _k(1, x)), small, y)


def _log2x(a: Expr) -> Expr:
    return _add(_fn("log", a), _k(math.log(2), a))


def _asinh(x: Expr) -> Expr:
    a = _fn("abs", x)
    sq = _mul(a, a)
    small = _fn("log1p", _add(a, _div(sq, _add(_k(1, x), _fn("sqrt", _add(_k(1, x), sq))))))
    return _signed(_sel(_cmp("gt", a, _k(_consts(x).big, x)), _log2x(a), small), x)


def _acosh(x: Expr) -> Expr:
    t = _sub(x, _k(1, x))
    small = _fn("log1p", _add(t, _fn("sqrt", _mul(t, _add(t, _k(2, x))))))
    y = _sel(_cmp("gt", x, _k(_consts(x).big, x)), _log2x(x), small)
    return _sel(_cmp("lt", x, _k(1, x)), _k(math.nan, x), y)


def _atanh(x: Expr) -> Expr:
    a = _fn("abs", x)
    y = _mul(_k(0.5, x), _fn("log1p", _div(_mul(_k(2, x), a), _sub(_k(1, x), a))))
    return _signed(y, x)


def _tan(x: Expr) -> Expr:
    return _div(_fn("sin", x), _fn("cos", x))


MATH: dict[str, Fn] = {
    "Tan": _tan, "Asin": _asin, "Acos": _acos, "Atan": _atan, "Sinh": _sinh, "Cosh": _cosh,
    "Asinh": _asinh, "Acosh": _acosh, "Atanh": _atanh,
}  # fmt: skip


@lowers(*MATH)
def lower_math(ctx: LowerContext, node: Node) -> None:
    _float_op(ctx, node, MATH[node.op_type])


# ---- BitwiseNot, CastLike ------------------------------------------------------------


@lowers("BitwiseNot")
def lower_bitwise_not(ctx: LowerContext, node: Node) -> None:
    def body(xs: list[Expr]) -> Expr:
        if is_float(xs[0].dtype) or xs[0].dtype == "bool":
            raise LoweringError(
                f"BitwiseNot node {node.name!r}: input has dtype {xs[0].dtype}; "
                "only integer types are supported"
            )
        return kb.unary("not", xs[0])

    elementwise(ctx, node, node.inputs[:1], body)


@lowers("CastLike")
def lower_cast_like(ctx: LowerContext, node: Node) -> None:
    like = ctx.constant(node.input(1))
    to = like.dtype.name if like is not None else ctx.buffer(node.input(1)).dtype
    if to not in DTYPES:
        raise LoweringError(f"CastLike node {node.name!r}: unsupported target type {to}")
    saturate = bool(int(node.attr("saturate", 1)))
    elementwise(ctx, node, node.inputs[:1], lambda xs: kb.cast(xs[0], to, saturate))


# ---- Hardmax -------------------------------------------------------------------------


@lowers("Hardmax")
def lower_hardmax(ctx: LowerContext, node: Node) -> None:
    """1 at the first maximum along the axis (opset >= 13), or of each row of the input
    coerced to 2-D at ``axis`` (older opsets), 0 elsewhere; a NaN counts as the maximum,
    as in numpy's argmax::

        S0, S1: m[..] = max x                     (over the axes, kept as size 1)
        S2, S3: k[..] = min (x == m or isnan x ? flat index : n)
        S4:     y = flat index == k ? 1 : 0
    """
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    if rank == 0:
        raise LoweringError(f"Hardmax node {node.name!r}: the input must have rank >= 1")
    new = node.opset >= 13
    axis = int(node.attr("axis", -1 if new else 1))
    if not -rank <= axis < rank + (not new):
        raise LoweringError(
            f"Hardmax node {node.name!r}: axis {axis} is out of range for rank {rank}"
        )
    axis = axis + rank if axis < 0 else axis
    axes = (axis,) if new else tuple(range(axis, rank))
    red = Reduction(x.shape, axes, keepdims=True)
    dt = x.dtype
    out = ctx.output(node.outputs[0], x.shape, dt).name
    m = ctx.temp(out + ".max", red.out_shape, dt).name
    k = ctx.temp(out + ".argmax", red.out_shape, "int64").name
    flat = _flat_index(red, x.shape)

    stmts = red.statements(m, x.name, dt, "max", lambda e: e)
    xv = red.read(x.name, "S3", dt)
    hit = kb.binary("or", _cmp("eq", xv, kb.load(red.write(m, "S3", True), dt)), _isnan(xv))
    stmts.append(
        Statement("S2", red.out_box("S2"), red.write(k, "S2", False), identity("min", "int64"))
    )
    stmts.append(
        Statement(
            "S3",
            kb.box("S3", red.loop_dims, x.shape),
            red.write(k, "S3", True),
            _sel(hit, flat, kb.const(red.count, "int64")),
            "min",
        )
    )
    won = _cmp("eq", flat, kb.load(red.write(k, "S4", True), "int64"))
    dims = red.loop_dims
    stmts.append(
        Statement(
            "S4",
            kb.box("S4", dims, x.shape),
            kb.access(out, "S4", dims, dims),
            _sel(won, kb.const(1, dt), kb.const(0, dt)),
        )
    )
    ctx.kernel(node, stmts)


def _flat_index(red: Reduction, shape: tuple[int, ...]) -> Expr:
    """The row-major position of the reduced dims' point, as an int64 expression."""
    index: Expr = kb.const(0, "int64")
    for a in red.axes:
        scaled = _mul(index, kb.const(shape[a], "int64"))
        index = _add(scaled, Iter("int64", red.loop_dims[a]))
    return index


def _isnan(x: Expr) -> Expr:
    if not is_float(x.dtype):
        return kb.const(False, "bool")
    return kb.unary("isnan", x, "bool")
