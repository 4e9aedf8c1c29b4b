"""Transcendental functions emitted as straight-line, vectorisable LLVM IR.

Every function here turns one ``float``/``double`` value, scalar or ``<N x float>``/
``<N x double>`` of any N, into a result of the same type using only arithmetic, integer
bit manipulation, ``select`` and intrinsics that lower to single instructions on x86-64
with FMA/AVX-512 (``llvm.fma``, ``llvm.fabs``, ``llvm.floor``, ``llvm.roundeven``,
``llvm.copysign``).  No branches and no new basic blocks are created, so a call can sit in
any loop body and the loop stays vectorisable; no libm function is called, for float or
for double.

Method, shared by all functions: reduce the argument to a small interval with an exact
(Cody-Waite, FMA) reduction or an exponent/mantissa split, approximate on that interval
with a minimax polynomial evaluated by Horner's rule in FMAs, and reconstruct.  Special
inputs (NaN, ±inf, ±0, subnormals, overflow and underflow) are handled by clamping the
input before any float->int conversion (so no lane ever produces poison) and by ``select``
on the result.  See ``docs/mathfn.md`` for the measured accuracy of every op.

The emitted instructions carry no fast-math flags on purpose: ``reassoc`` or ``nnan``
would break the exact range reductions and the special-value selects.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from llvmlite import ir

__all__ = ["MATH_OPS", "emit_math", "emit_pow"]

MATH_OPS: frozenset[str] = frozenset(
    {"exp", "expneg", "expm1", "log", "log1p", "tanh", "sigmoid", "softplus", "erf", "sin", "cos"}
)


# --------------------------------------------------------------------------------------
# Per-format constants.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Format:
    """Bit layout, limits and polynomial coefficients of one IEEE binary format.

    Polynomial coefficient tuples are highest degree first (Horner order).
    """

    bits: int
    mant: int  # explicit mantissa bits
    bias: int
    tiny: float  # |x| below this, sin x rounds to x: return x (also keeps sin(-0) = -0)
    exp_hi: float  # exp/expm1 clamp: above this the result overflows to inf
    exp_lo: float  # exp clamp: below this the result rounds to +0
    expm1_lo: float  # expm1 clamp: below this the result rounds to -1
    tanh_hi: float  # |x| above this: tanh rounds to ±1
    erf_split: float  # |x| below: erf = x*P(x^2); above: 1 - exp(-x^2)*Q(x)
    erf_hi: float  # |x| above this: erf rounds to ±1
    ln2_hi: float  # ln2 = ln2_hi + ln2_lo, ln2_hi with trailing zero bits
    ln2_lo: float
    expm1_poly: tuple[float, ...]  # (e^r - 1 - r)/r^2 on |r| <= ln2/2
    exp_poly: tuple[float, ...]  # (e^r - 1)/r on |r| <= ln2/2 (+ slack), for e^r's relative error
    log_poly: tuple[float, ...]  # log1p on the reduced argument (form differs, see below)
    sin_poly: tuple[float, ...]  # (sin r - r)/r^3 as a polynomial in r^2, |r| <= pi/4
    cos_poly: tuple[float, ...]  # (cos r - 1 + r^2/2)/r^4 in r^2, |r| <= pi/4
    pio2: tuple[float, float, float]  # pi/2 = sum, for a three-step FMA reduction
    erf_small: tuple[float, ...]  # erf(x)/x in x^2 on [0, erf_split]
    erf_big: tuple[float, ...]  # Q(t): erfc x = t exp(-x^2 + Q(t)), t = 2/(2+x), x >= split

    @property
    def int_type(self) -> ir.IntType:
        return ir.IntType(self.bits)

    def bits_of(self, value: float) -> int:
        """The IEEE bit pattern of ``value`` in this format, as an unsigned integer."""
        if self.bits == 32:
            return struct.unpack("<I", struct.pack("<f", value))[0]
        return struct.unpack("<Q", struct.pack("<d", value))[0]


def _pio2_split(to_fmt) -> tuple[float, float, float]:
    """pi/2 as three numbers of the format, each the rounded remainder of the previous."""
    # pi/2 to 60 significant digits, as an exact fraction via integer arithmetic.
    num = 157079632679489661923132169163975144209858469968755291048747
    den = 10**59
    parts = []
    for _ in range(3):
        part = to_fmt(num / den)
        parts.append(part)
        # subtract the part exactly: part is a dyadic rational
        p_num, p_den = part.as_integer_ratio()
        num, den = num * p_den - p_num * den, den * p_den
    return parts[0], parts[1], parts[2]


def _to_f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _to_f64(value: float) -> float:
    return float(value)


_F32 = _Format(
    bits=32,
    mant=23,
    bias=127,
    tiny=2.0**-12,
    exp_hi=89.0,
    exp_lo=-104.0,
    expm1_lo=-30.0,
    tanh_hi=9.1,
    erf_split=0.875,
    erf_hi=4.0,
    # Cephes split: 0.693359375 has 9 significant bits, so k*ln2_hi is exact for |k| < 2^15.
    ln2_hi=0.693359375,
    ln2_lo=-2.12194440e-4,
    # Cephes expf: minimax for (e^r - 1 - r)/r^2 on |r| <= ln2/2.
    expm1_poly=(
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    ),
    # Fit for this module (docs/mathfn.md): relative error 3.1e-9 of 1 + r Q(r) = e^r on
    # |r| <= 0.347, coefficients rounded to float one by one and the rest refitted.
    exp_poly=(
        1.3819511514157057e-3,
        8.368690498173237e-3,
        4.1668280959129333e-2,
        1.666652113199234e-1,
        4.999999403953552e-1,
        1.0,
    ),
    # Cephes logf: log(1+f) = f - f^2/2 + f^3 P(f), f in [sqrt(1/2)-1, sqrt(2)-1].
    log_poly=(
        7.0376836292e-2,
        -1.1514610310e-1,
        1.1676998740e-1,
        -1.2420140846e-1,
        1.4249322787e-1,
        -1.6668057665e-1,
        2.0000714765e-1,
        -2.4999993993e-1,
        3.3333331174e-1,
    ),
    # Cephes sinf/cosf kernels on |r| <= pi/4.
    sin_poly=(-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1),
    cos_poly=(2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2),
    pio2=_pio2_split(_to_f32),
    # Remez (mpmath) fits, see docs/mathfn.md: relative error 2.0e-10 of erf(x)/x on
    # [0, 0.875]; absolute error 1.6e-10 of erfc on [0.875, 4].
    erf_small=(
        8.6753915614047022e-5,
        -8.2111038969803907e-4,
        5.2067474262094143e-3,
        -2.6861584702824198e-2,
        1.1283733002657434e-1,
        -3.7612636065751253e-1,
        1.1283791668693783,
    ),
    erf_big=(
        0.28132119920972766,
        -0.85540082623963602,
        0.63138342596371043,
        0.17380065393925467,
        1.03773526919002,
        -1.2683635680996905,
    ),
)

# Remez fit of (e^r - 1 - r)/r^2 on |r| <= ln2/2, weighted for the relative error of expm1:
# 2.6e-19.  exp uses it as (e^r - 1)/r = 1 + r P(r).
_F64_EXPM1_POLY = (
    2.0875329922881296986e-9,
    2.510900045912246547e-8,
    2.7557402703672395101e-7,
    2.7557244317375898872e-6,
    2.480158717239570902e-5,
    1.9841269886016844939e-4,
    1.3888888888962479427e-3,
    8.3333333333216738364e-3,
    4.1666666666666508491e-2,
    1.6666666666666676526e-1,
    5.0000000000000000085e-1,
)

_F64 = _Format(
    bits=64,
    mant=52,
    bias=1023,
    tiny=2.0**-27,
    exp_hi=710.0,
    exp_lo=-746.0,
    expm1_lo=-40.0,
    tanh_hi=20.0,
    erf_split=0.875,
    erf_hi=6.0,
    # fdlibm split: ln2_hi has 32 trailing zero bits.
    ln2_hi=6.93147180369123816490e-01,
    ln2_lo=1.90821492927058770002e-10,
    expm1_poly=_F64_EXPM1_POLY,
    exp_poly=(*_F64_EXPM1_POLY, 1.0),
    # fdlibm log: log(1+f) = 2s + s*R(s^2), s = f/(2+f); R = z*(Lg1 + z*(Lg2 + ...)).
    log_poly=(
        1.479819860511658591e-01,
        1.531383769920937332e-01,
        1.818357216161805012e-01,
        2.222219843214978396e-01,
        2.857142874366239149e-01,
        3.999999999940941908e-01,
        6.666666666666735130e-01,
    ),
    # fdlibm __kernel_sin / __kernel_cos on |r| <= pi/4, error < 2^-58.
    sin_poly=(
        1.58969099521155010221e-10,
        -2.50507602534068634195e-08,
        2.75573137070700676789e-06,
        -1.98412698298579493134e-04,
        8.33333333332248946124e-03,
        -1.66666666666666324348e-01,
    ),
    cos_poly=(
        -1.13596475577881948265e-11,
        2.08757232129817482790e-09,
        -2.75573143513906633035e-07,
        2.48015872894767294178e-05,
        -1.38888888888741095749e-03,
        4.16666666666666019037e-02,
    ),
    pio2=_pio2_split(_to_f64),
    # Remez (mpmath) fits: relative error 2.2e-17 of erf(x)/x on [0, 0.875]; absolute error
    # 4.0e-18 of erfc on [0.875, 6].
    erf_small=(
        1.0456783600498901676e-8,
        -1.5619256435943959377e-7,
        1.6387374519632568185e-6,
        -0.000014920942013638318391,
        0.00012055141079250437824,
        -0.00085483219773939367658,
        0.0052239775424412050215,
        -0.026866170637143297644,
        0.1128379167091558661,
        -0.37612638903182986781,
        1.1283791670955125493,
    ),
    erf_big=(
        0.31045275687484063521,
        -2.2013396534506863474,
        6.8837648042855334126,
        -12.342611634486500545,
        13.86001688739894962,
        -10.194384251374725818,
        5.320487313083318128,
        -2.2202517730785695794,
        0.49041552364724784771,
        -0.029815986445333621513,
        0.38992418156526392096,
        0.99881307744343259434,
        -1.2654691349232835154,
    ),
)

_LOG2E = 1.4426950408889634074
_TWO_OVER_PI = 0.63661977236758134308
_SQRT_HALF = 0.70710678118654752440
_INF = math.inf
_NAN = math.nan


# --------------------------------------------------------------------------------------
# A thin typed layer over IRBuilder for one value type.
# --------------------------------------------------------------------------------------


class _Emitter:
    """Emits code for one float type (scalar or vector) through one IRBuilder.

    Constants are splatted to the value's shape; intrinsics get their overloaded name from
    the shape (``llvm.fma.v16f32``) and are declared once per module.
    """

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type):
        elem = ty.element if isinstance(ty, ir.VectorType) else ty
        if isinstance(elem, ir.FloatType):
            self.fmt, suffix = _F32, "f32"
        elif isinstance(elem, ir.DoubleType):
            self.fmt, suffix = _F64, "f64"
        else:
            raise TypeError(f"mathfn: expected float or double (vector) type, got {ty}")
        self.b = builder
        self.ty = ty
        self.lanes = ty.count if isinstance(ty, ir.VectorType) else None
        self.suffix = suffix if self.lanes is None else f"v{self.lanes}{suffix}"
        self.ity = self.shape(self.fmt.int_type)

    def shape(self, elem: ir.Type) -> ir.Type:
        """``elem`` as a scalar or a vector of the same width as this emitter's type."""
        return elem if self.lanes is None else ir.VectorType(elem, self.lanes)

    # AVX-512 ---------------------------------------------------------------------------
    def has_scalef(self) -> bool:
        """Whether ``vscalefps`` can be used: 16 floats on an x86 target with AVX-512F (as
        emit/module.py records on the module)."""
        module = self.b.module
        return (
            self.fmt is _F32
            and self.lanes == 16
            and module.triple.startswith("x86_64")
            and "+avx512f" in getattr(module, "cpu_features", "").split(",")
        )

    def scalef(self, a, b):
        """a 2^floor(b), rounded once (overflow to inf, gradual underflow), NaN kept."""
        name = "llvm.x86.avx512.mask.scalef.ps.512"
        i16 = ir.IntType(16)
        module = self.b.module
        fn = module.globals.get(name) or ir.Function(
            module,
            ir.FunctionType(self.ty, [self.ty, self.ty, self.ty, i16, ir.IntType(32)]),
            name,
        )
        everywhere, current_rounding = ir.Constant(i16, -1), ir.Constant(ir.IntType(32), 4)
        return self.b.call(fn, [a, b, a, everywhere, current_rounding])

    # constants ------------------------------------------------------------------------
    def f(self, value: float) -> ir.Constant:
        return ir.Constant(self.ty, value)

    def i(self, value: int) -> ir.Constant:
        return ir.Constant(self.ity, value)

    # intrinsics -----------------------------------------------------------------------
    def intrinsic(self, base: str, *args: ir.Value) -> ir.Value:
        name = f"llvm.{base}.{self.suffix}"
        module = self.b.module
        fn = module.globals.get(name)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * len(args)), name)
        return self.b.call(fn, list(args))

    def fma(self, a, b, c):
        return self.intrinsic("fma", a, b, c)

    def fabs(self, a):
        return self.intrinsic("fabs", a)

    def floor(self, a):
        return self.intrinsic("floor", a)

    def roundeven(self, a):
        return self.intrinsic("roundeven", a)

    def copysign(self, mag, sign):
        return self.intrinsic("copysign", mag, sign)

    # arithmetic -----------------------------------------------------------------------
    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def horner(self, x, coeffs: tuple[float, ...]):
        """sum c_i x^(n-i) by Horner's rule, one FMA per coefficient."""
        acc = self.f(coeffs[0])
        for c in coeffs[1:]:
            acc = self.fma(acc, x, self.f(c))
        return acc

    # comparisons and selection --------------------------------------------------------
    def cmp(self, op: str, a, b):
        """Ordered compare: false whenever an operand is NaN."""
        return self.b.fcmp_ordered(op, a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def clamp_below(self, x, hi: float):
        """min(x, hi) with NaN mapped to hi (one vminps): makes later fptosi safe."""
        return self.sel(self.cmp("<", x, self.f(hi)), x, self.f(hi))

    def clamp_above(self, x, lo: float):
        """max(x, lo) for non-NaN x (one vmaxps)."""
        return self.sel(self.cmp(">", x, self.f(lo)), x, self.f(lo))

    # bits -----------------------------------------------------------------------------
    def as_int(self, a):
        return self.b.bitcast(a, self.ity)

    def as_float(self, a):
        return self.b.bitcast(a, self.ty)

    def to_int(self, a):
        return self.b.fptosi(a, self.ity)

    def to_float(self, a):
        return self.b.sitofp(a, self.ty)

    def pow2(self, k):
        """2^k as a float, for integer k in the normal exponent range."""
        biased = self.b.add(k, self.i(self.fmt.bias))
        return self.as_float(self.b.shl(biased, self.i(self.fmt.mant)))

    def ldexp(self, y, k):
        """y * 2^k in two exact steps, so results that overflow become inf and results in
        the subnormal range are rounded once (|k| up to about twice the exponent range)."""
        k1 = self.b.ashr(k, self.i(1))
        k2 = self.b.sub(k, k1)
        return self.mul(self.mul(y, self.pow2(k1)), self.pow2(k2))


# --------------------------------------------------------------------------------------
# exp / expm1: Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, minimax on r.
# --------------------------------------------------------------------------------------


def _exp_reduce(e: _Emitter, x, lo: float):
    """Clamp x to [lo, exp_hi] (NaN -> exp_hi, fixed by the caller), then split it as
    k*ln2 + r with k integral and |r| <= ln2/2.  The two-part ln2 makes r exact but for
    the last rounding; returns k (as a float) and expm1(r)."""
    fmt = e.fmt
    xc = e.clamp_above(e.clamp_below(x, fmt.exp_hi), lo)
    k = e.roundeven(e.mul(xc, e.f(_LOG2E)))
    r = e.fma(k, e.f(-fmt.ln2_hi), xc)
    r = e.fma(k, e.f(-fmt.ln2_lo), r)
    # expm1(r) = r + r^2 P(r): the leading r is added last so it is not rounded away.
    p = e.fma(e.mul(r, r), e.horner(r, fmt.expm1_poly), r)
    return k, p


def _magic_reduce(e: _Emitter, xc, magic: float):
    """x = k ln2 + r for ``_exp`` and ``_expneg``: k = x log2e rounded once by adding
    ``magic`` (one FMA; the sum's low bits hold k plus magic's offset), read back exactly
    by subtracting it, and r by the two-part ln2 in two FMAs. Returns (the sum, k, r)."""
    fmt = e.fmt
    j = e.fma(xc, e.f(_LOG2E), e.f(magic))
    k = e.sub(j, e.f(magic))
    r = e.fma(k, e.f(-fmt.ln2_hi), xc)
    return j, k, e.fma(k, e.f(-fmt.ln2_lo), r)


def _exp(e: _Emitter, x):
    """e^x = 2^k e^r, x = k ln2 + r, |r| <= ln2/2 (float: 18 instructions on AVX-512).

    - Clamp x to [exp_lo, exp_hi] with selects that keep NaN (two vmin/vmax).  From there
      on plain arithmetic gives exp(-inf) = 0, exp(inf) = inf, overflow to inf, gradual
      underflow to 0, and NaN propagates: no special-value select is needed.
    - k = x log2e rounded once by adding the magic number 1.5*2^mant + (bias - 1) (one
      FMA), read back exactly by subtracting it; the low bits of the sum's pattern are
      k + bias - 1, in range after the clamp.  r by the two-part (Cody-Waite) ln2 in two
      FMAs; the first is exact.
    - p(r) = 2 e^r: ``exp_poly`` doubled (exactly), Horner in FMAs, the last one adding 2
      so the result is rounded once.  The factor 2 lets 2^(k-1) stand for 2^k below.
    - Scale without a float->int conversion: the sum's pattern shifted left by mant is
      2^(k-1)'s pattern for every k in range (the magic's own bits shift out).  It is
      split as 2^(k-1) = 2^kn 2^(k-1-kn), kn = max(k-1, 1-bias) by an integer max, so
      both factors are normal: p 2^(k-1-kn) is exact, and the multiply by 2^kn rounds
      subnormal results once and overflows to inf.  (Adding k-1-kn to p's exponent bits
      instead would save an instruction but can turn a NaN p into a number.)"""
    fmt = e.fmt
    xc = e.sel(e.cmp(">", x, e.f(fmt.exp_hi)), e.f(fmt.exp_hi), x)
    xc = e.sel(e.cmp("<", xc, e.f(fmt.exp_lo)), e.f(fmt.exp_lo), xc)
    j, k, r = _magic_reduce(e, xc, 1.5 * 2.0**fmt.mant + (fmt.bias - 1))
    q = e.horner(r, tuple(2.0 * c for c in fmt.exp_poly))
    p = e.fma(q, r, e.f(2.0))
    if e.has_scalef():  # p 2^(k-1) rounded once, in one instruction: the same result
        return e.scalef(p, e.sub(k, e.f(1.0)))
    scale = e.b.shl(e.as_int(j), e.i(fmt.mant))  # 2^(k-1); wraps below the normal range
    min_normal = e.i(1 << fmt.mant)  # the pattern of 2^(1-bias)
    normal = e.b.select(e.b.icmp_signed(">", scale, min_normal), scale, min_normal)
    rest = e.b.add(e.b.sub(scale, normal), e.i(fmt.bits_of(1.0)))  # 2^(k-1-kn)
    return e.mul(e.mul(p, e.as_float(rest)), e.as_float(normal))


def _expneg(e: _Emitter, x):
    """e^x for x <= 0 (Softmax's ``x - max(x)``; NaN and -inf too): ``_exp`` without the
    work its whole range needs, 13 operations instead of 18.

    - No upper clamp, and a lower one at -bias ln2 (one max that keeps NaN), where k =
      -bias: the magic number holds k + bias, so the sum's pattern shifted left by mant is
      2^k's for k > -bias, and +0 at k = -bias. p = e^r (``exp_poly`` as it is) times
      2^k is then rounded once: exact down to the subnormal results of k = 1 - bias, and
      0 from x < (1/2 - bias) ln2 (float: -87.68, where e^x < 8.5e-39), so the absolute
      error stays under the smallest normal float. -inf gives 0, NaN stays NaN (p is NaN).
    - Arguments up to ln(max float) are exact as well.

    With AVX2's 16 registers ``_exp``'s constants spilled in a 4-vector loop: Softmax
    512 x 1024, 1 thread, went 1.12-1.13 -> 0.93-0.95 times onnxruntime's time."""
    fmt = e.fmt
    lo = -fmt.bias * math.log(2.0)
    xc = e.sel(e.cmp("<", x, e.f(lo)), e.f(lo), x)
    j, _, r = _magic_reduce(e, xc, 1.5 * 2.0**fmt.mant + fmt.bias)
    p = e.fma(e.horner(r, fmt.exp_poly), r, e.f(1.0))
    return e.mul(p, e.as_float(e.b.shl(e.as_int(j), e.i(fmt.mant))))  # p 2^k


def _expm1(e: _Emitter, x):
    """e^x - 1 = 2^k expm1(r) + (2^k - 1) in one FMA; 2^k - 1 is exact for
    k <= mantissa bits.  Larger k: the -1 is below half an ulp, use 2^k (1 + expm1(r))."""
    fmt = e.fmt
    k, p = _exp_reduce(e, x, fmt.expm1_lo)
    ki = e.to_int(k)
    big = e.b.icmp_signed(">", ki, e.i(fmt.mant + 1))
    s = e.pow2(e.b.select(big, e.i(0), ki))
    small_y = e.fma(s, p, e.sub(s, e.f(1.0)))
    big_y = e.ldexp(e.add(p, e.f(1.0)), ki)
    y = e.sel(big, big_y, small_y)
    y = e.sel(e.cmp("==", x, e.f(0.0)), x, y)  # expm1(-0) = -0
    return e.sel(e.isnan(x), x, y)


# --------------------------------------------------------------------------------------
# log / log1p: x = 2^k m with m in [sqrt(1/2), sqrt(2)), log x = k ln2 + log1p(m - 1).
# --------------------------------------------------------------------------------------


def _log_split(e: _Emitter, x):
    """Exponent k (as float) and f = m - 1 (exact) of a positive x.

    Subnormals are first scaled by 2^mant.  Adding bits(1.0) - bits(sqrt(1/2)) to the bit
    pattern carries into the exponent exactly when the mantissa (in [1, 2)) is >= sqrt(2),
    so m lands in [sqrt(1/2), sqrt(2)) without a compare (musl's trick)."""
    fmt = e.fmt
    tiny = e.cmp("<", x, e.f(2.0 ** (1 - fmt.bias)))
    xs = e.sel(tiny, e.mul(x, e.f(2.0**fmt.mant)), x)
    one_bits, sqrth_bits = fmt.bits_of(1.0), fmt.bits_of(_SQRT_HALF)
    ix = e.b.add(e.as_int(xs), e.i(one_bits - sqrth_bits))
    k = e.b.sub(e.b.ashr(ix, e.i(fmt.mant)), e.i(fmt.bias))
    k = e.b.sub(k, e.b.select(tiny, e.i(fmt.mant), e.i(0)))
    m = e.as_float(e.b.add(e.b.and_(ix, e.i((1 << fmt.mant) - 1)), e.i(sqrth_bits)))
    return e.to_float(k), e.sub(m, e.f(1.0))


def _log_core32(e: _Emitter, k, f):
    """float: log(1+f) = f - f^2/2 + f^3 P(f) (Cephes), no division; k ln2 is added in
    two parts, the big one last, so the result is within about one ulp."""
    fmt = e.fmt
    z = e.mul(f, f)
    y = e.mul(e.mul(z, f), e.horner(f, fmt.log_poly))
    y = e.fma(k, e.f(fmt.ln2_lo), y)
    y = e.fma(z, e.f(-0.5), y)
    return e.fma(k, e.f(fmt.ln2_hi), e.add(f, y))


def _log_core64(e: _Emitter, k, f):
    """double: fdlibm's log: s = f/(2+f), log(1+f) = 2 atanh(s) = f - hfsq + s(hfsq + R(s^2))
    with hfsq = f^2/2; accurate to < 1 ulp."""
    fmt = e.fmt
    s = e.div(f, e.add(f, e.f(2.0)))
    z = e.mul(s, s)
    r = e.mul(z, e.horner(z, fmt.log_poly))
    hfsq = e.mul(e.f(0.5), e.mul(f, f))
    t = e.fma(s, e.add(hfsq, r), e.mul(k, e.f(fmt.ln2_lo)))
    return e.fma(k, e.f(fmt.ln2_hi), e.sub(f, e.sub(hfsq, t)))


def _log_positive(e: _Emitter, x):
    """log x for finite x > 0 (other inputs give garbage: the caller selects)."""
    k, f = _log_split(e, x)
    core = _log_core32 if e.fmt.bits == 32 else _log_core64
    return core(e, k, f)


def _log_specials(e: _Emitter, x, y):
    """log's special values: log(+inf) = inf, log(±0) = -inf, log(x < 0) = log(NaN) = NaN."""
    y = e.sel(e.cmp("==", x, e.f(_INF)), e.f(_INF), y)
    y = e.sel(e.cmp("==", x, e.f(0.0)), e.f(-_INF), y)
    return e.sel(e.b.fcmp_unordered("<", x, e.f(0.0)), e.f(_NAN), y)


def _log(e: _Emitter, x):
    return _log_specials(e, x, _log_positive(e, x))


def _log1p(e: _Emitter, u):
    """log(1+u) = log(w) + c with w = fl(1+u) and c = (u - (w-1))/w the rounding error
    of w relative to w (Goldberg's correction), so small u keep full relative accuracy."""
    one = e.f(1.0)
    w = e.add(u, one)
    c = e.div(e.sub(u, e.sub(w, one)), w)
    c = e.sel(e.isnan(c), e.f(0.0), c)  # w = 0 or inf: c is 0/0 or inf-inf
    y = _log_specials(e, w, e.add(_log_positive(e, w), c))
    y = e.sel(e.cmp("==", u, e.f(0.0)), u, y)  # log1p(-0) = -0
    return e.sel(e.isnan(u), u, y)


# --------------------------------------------------------------------------------------
# Functions built on exp / expm1 / log1p.
# --------------------------------------------------------------------------------------


def _tanh(e: _Emitter, x):
    """tanh|x| = m/(m+2) with m = expm1(2|x|): no cancellation anywhere, so the relative
    error is a few ulp from 0 (where it is x/(1+x) ~ x) to the clamp, past which tanh
    rounds to 1.  The sign is copied back, so tanh is odd and tanh(±0) = ±0."""
    ax = e.fabs(x)
    ax = e.sel(e.cmp(">", ax, e.f(e.fmt.tanh_hi)), e.f(e.fmt.tanh_hi), ax)  # NaN stays
    m = _expm1(e, e.add(ax, ax))
    return e.copysign(e.div(m, e.add(m, e.f(2.0))), x)


def _sigmoid(e: _Emitter, x):
    """1/(1+e^-x) for x >= 0 and e^x/(1+e^x) for x < 0, from one t = e^-|x|: both forms
    only divide positive numbers, so the relative error stays small even where sigmoid
    underflows towards 0 (x -> -inf gives 0, x -> inf gives 1)."""
    t = _exp(e, e.b.fneg(e.fabs(x)))
    num = e.sel(e.cmp("<", x, e.f(0.0)), t, e.f(1.0))
    return e.div(num, e.add(t, e.f(1.0)))


def _softplus(e: _Emitter, x):
    """log(1+e^x) = max(x, 0) + log1p(e^-|x|): e^-|x| never overflows, and log1p keeps
    the relative accuracy where softplus(x) ~ e^x underflows for very negative x."""
    t = _exp(e, e.b.fneg(e.fabs(x)))
    pos = e.sel(e.cmp(">", x, e.f(0.0)), x, e.f(0.0))
    return e.add(pos, _log1p(e, t))


def _erf(e: _Emitter, x):
    """erf, odd.  |x| < erf_split: x P(x^2), minimax for relative error.  Above:
    1 - erfc|x| with erfc(a) = t exp(-a^2 + Q(t)), t = 2/(2+a) (the Numerical Recipes
    form, refitted minimax for absolute error); a^2 goes through one FMA so the exponent
    is rounded once.  |x| is clamped where erf rounds to 1, which also makes erf(±inf) = ±1;
    NaN propagates through both paths."""
    fmt = e.fmt
    ax = e.fabs(x)
    small = _erf_small(e, ax)
    a = e.sel(e.cmp(">", ax, e.f(fmt.erf_hi)), e.f(fmt.erf_hi), ax)
    t = e.div(e.f(2.0), e.add(a, e.f(2.0)))
    expo = e.fma(e.b.fneg(a), a, e.horner(t, fmt.erf_big))
    erfc = e.mul(t, _exp(e, expo))
    big = e.sub(e.f(1.0), erfc)
    y = e.sel(e.cmp("<", ax, e.f(fmt.erf_split)), small, big)
    return e.copysign(y, x)


def _erf_small(e: _Emitter, ax):
    """erf(a) = a P(a^2) for small a as fma(a, c0_hi, a (c0_lo + a^2 Q(a^2))): the leading
    coefficient 2/sqrt(pi) is carried in two parts (in float it alone would cost 0.4 ulp)
    and only the small correction term is rounded before the final FMA."""
    coeffs = e.fmt.erf_small
    c0 = coeffs[-1]
    c0_hi = _to_f32(c0) if e.fmt.bits == 32 else c0
    z = e.mul(ax, ax)
    corr = e.fma(z, e.horner(z, coeffs[:-1]), e.f(c0 - c0_hi))
    return e.fma(ax, e.f(c0_hi), e.mul(ax, corr))


# --------------------------------------------------------------------------------------
# sin / cos: x = k pi/2 + r, |r| <= pi/4 (plus the rounding of k), quadrant from k mod 4.
# --------------------------------------------------------------------------------------


def _sincos(e: _Emitter, x, is_cos: bool):
    """k = round(x 2/pi); r = x - k pi/2 in three FMA steps with pi/2 split into three
    parts of the format: the first step is exact (|r| < 2, so x - k*P1 fits the mantissa),
    the next two are rounded once each, so r is accurate to an ulp of r.  The accuracy
    holds while k is the nearest integer to x 2/pi within a small slack (see docs).  The
    quadrant k mod 4 is computed in floating point (exact for any k) and picks sin r or
    cos r and the sign.  ±inf and NaN give NaN."""
    fmt = e.fmt
    finite = e.cmp("<", e.fabs(x), e.f(_INF))
    xs = e.sel(finite, x, e.f(0.0))  # no inf/NaN reaches the float->int conversion
    k, r = _reduce_pio2(e, xs)
    k2, r = _reduce_pio2(e, r)  # k can be off by a few once ulp(x 2/pi) >= 1/4: fix it
    lim = fmt.pio2[0] / 2 + 0.05  # |r| <= pi/4 + rounding inside the range; bound it beyond
    r = e.clamp_above(e.clamp_below(r, lim), -lim)
    z = e.mul(r, r)
    sin_r = e.fma(e.mul(z, r), e.horner(z, fmt.sin_poly), r)
    cos_r = _cos_kernel(e, z)
    q = e.to_int(e.add(_mod4(e, k), _mod4(e, k2)))
    if is_cos:
        q = e.b.add(q, e.i(1))  # cos x = sin(x + pi/2)
    odd = e.b.icmp_unsigned("!=", e.b.and_(q, e.i(1)), e.i(0))
    y = e.sel(odd, cos_r, sin_r)
    sign = e.b.shl(e.b.and_(q, e.i(2)), e.i(fmt.bits - 2))  # quadrants 2, 3: negate
    y = e.as_float(e.b.xor(e.as_int(y), sign))
    if not is_cos:
        y = e.sel(e.cmp("<", e.fabs(x), e.f(fmt.tiny)), x, y)  # sin x = x, keeps -0
    return e.sel(finite, y, e.f(_NAN))


def _reduce_pio2(e: _Emitter, x):
    """(k, x - k pi/2) with k = round(x 2/pi), in three FMA steps (see _sincos)."""
    k = e.roundeven(e.mul(x, e.f(_TWO_OVER_PI)))
    for part in e.fmt.pio2:
        x = e.fma(k, e.f(-part), x)
    return k, x


def _mod4(e: _Emitter, k):
    """k mod 4 in [0, 4) for a finite integral float k, exact for every k (k - 4 floor(k/4)
    has no rounding, and k >= 2^(mant+2) is a multiple of 4)."""
    return e.sub(k, e.mul(e.floor(e.mul(k, e.f(0.25))), e.f(4.0)))


def _cos_kernel(e: _Emitter, z):
    """cos r = 1 - z/2 + z^2 C(z), z = r^2; w = 1 - z/2 is rounded, and its exact error
    (1 - w) - z/2 is added back with the tail (fdlibm's trick), so cos r is good to an ulp."""
    hz = e.mul(z, e.f(0.5))
    w = e.sub(e.f(1.0), hz)
    tail = e.fma(e.mul(z, z), e.horner(z, e.fmt.cos_poly), e.sub(e.sub(e.f(1.0), w), hz))
    return e.add(w, tail)


# --------------------------------------------------------------------------------------
# Public entry points.
# --------------------------------------------------------------------------------------

_OPS = {
    "exp": _exp,
    "expneg": _expneg,
    "expm1": _expm1,
    "log": _log,
    "log1p": _log1p,
    "tanh": _tanh,
    "sigmoid": _sigmoid,
    "softplus": _softplus,
    "erf": _erf,
    "sin": lambda e, x: _sincos(e, x, is_cos=False),
    "cos": lambda e, x: _sincos(e, x, is_cos=True),
}
assert frozenset(_OPS) == MATH_OPS


def emit_math(builder: ir.IRBuilder, op: str, x: ir.Value) -> ir.Value:
    """Emit ``op(x)`` at the builder's position and return the result (x's type).

    ``x`` is a ``float`` or ``double``, scalar or vector of any width; ``op`` is one of
    :data:`MATH_OPS`.  Only straight-line instructions are emitted (no new blocks)."""
    if op not in _OPS:
        raise ValueError(f"emit_math: unknown op {op!r}; supported: {sorted(MATH_OPS)}")
    return _OPS[op](_Emitter(builder, x.type), x)


def _pow_magnitude(e: _Emitter, a, b):
    """|a|^b = exp(b log|a|).  For float the whole chain runs in double (exact product,
    double log and exp), so the result is correctly rounded but for rare ties however
    large b log|a| is; for double it is exp(b log|a|) in double (error ~ |b log a| ulp)."""
    builder = e.b
    if e.fmt.bits == 32:
        dty = e.shape(ir.DoubleType())
        d = _Emitter(builder, dty)
        ad = builder.fpext(e.fabs(a), dty)
        bd = builder.fpext(b, dty)
        return builder.fptrunc(_exp(d, d.mul(bd, _log(d, ad))), e.ty)
    return _exp(e, e.mul(b, _log(e, e.fabs(a))))


def emit_pow(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """Emit ONNX ``Pow(a, b)`` for float/double a and b of the same (scalar or vector) type,
    with C/numpy ``pow`` semantics.

    Magnitude from :func:`_pow_magnitude`; then, by select: a < 0 with odd integer b
    negates (the sign bit of a is used, so pow(-0, 3) = -0), finite a < 0 with non-integer b
    is NaN; pow(±1, ±inf) = 1, pow(1, y) = 1 and pow(x, 0) = 1 even for NaN; b = 1 gives a
    and b = 2 gives a*a exactly.  a = ±0 and ±inf follow from log|a| = ∓inf/inf."""
    if a.type != b.type:
        raise TypeError(f"emit_pow: operand types differ: {a.type} vs {b.type}")
    e = _Emitter(builder, a.type)
    one = e.f(1.0)
    y = _pow_magnitude(e, a, b)
    fb = e.floor(b)
    is_int = e.cmp("==", fb, b)  # false for NaN, true for ±inf
    odd = e.cmp("!=", e.mul(e.floor(e.mul(b, e.f(0.5))), e.f(2.0)), b)
    odd = builder.and_(is_int, odd)
    neg = builder.icmp_signed("<", e.as_int(a), e.i(0))  # sign bit, so -0 counts
    y = e.sel(builder.and_(neg, odd), e.b.fneg(y), y)
    finite_neg = builder.and_(e.cmp("<", a, e.f(0.0)), e.cmp(">", a, e.f(-_INF)))
    y = e.sel(builder.and_(finite_neg, builder.not_(is_int)), e.f(_NAN), y)
    unit_inf = builder.and_(e.cmp("==", e.fabs(a), one), e.cmp("==", e.fabs(b), e.f(_INF)))
    y = e.sel(unit_inf, one, y)
    y = e.sel(e.cmp("==", a, one), one, y)
    y = e.sel(e.cmp("==", b, one), a, y)
    y = e.sel(e.cmp("==", b, e.f(2.0)), e.mul(a, a), y)
    return e.sel(e.cmp("==", b, e.f(0.0)), one, y)
