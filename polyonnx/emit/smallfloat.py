"""Decode and encode ONNX's narrow storage types as straight-line LLVM IR.

polyonnx keeps tensors of the exotic ONNX element types in memory in the layout numpy and
``ml_dtypes`` use: ``bfloat16`` in 2 bytes; the float8 types, ``float4_e2m1fn``, the
float6 types and ``int4``/``uint4``/``int2``/``uint2`` *unpacked*, one element per byte, in
the low bits.  Arithmetic never happens in these types: a value is widened right after its
load (:func:`emit_decode`, to ``float`` for float kinds, to a sign- or zero-extended ``i8``
for int kinds) and narrowed right before its store (:func:`emit_encode`, with ONNX ``Cast``
semantics).

Both functions accept a scalar or a ``<N x T>`` vector of any N and emit only integer bit
manipulation, ``select``, compares, conversions and at most one ``fadd``/``fmul``: no
branches, no new basic blocks, no calls, no tables.  So they can sit in any loop body and
vectorise.  No instruction carries fast-math flags; the results do not depend on the
MXCSR denormal modes (float32 subnormals only reach paths where they round to zero anyway).

The results match, bit for bit, what ``onnx.reference`` computes for ``Cast`` (which is
``ml_dtypes``' conversions, plus ``numpy_helper.saturate_cast`` for float8 with
``saturate=1`` and ``numpy_helper.to_float8e8m0`` for ``float8e8m0``).  The rules, per type,
are in ``docs/smallfloat.md``; ``tests/emit/test_smallfloat.py`` checks every raw pattern of
every type and dense float32/float64/integer sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from polyonnx.errors import CodegenError

__all__ = ["ROUND_MODES", "SMALL_DTYPES", "emit_decode", "emit_encode"]

SMALL_DTYPES: dict[str, tuple[int, str]] = {
    "bfloat16": (16, "float"),
    "float8_e4m3fn": (8, "float"),
    "float8_e4m3fnuz": (8, "float"),
    "float8_e5m2": (8, "float"),
    "float8_e5m2fnuz": (8, "float"),
    "float8_e8m0fnu": (8, "float"),
    "float4_e2m1fn": (8, "float"),
    "float6_e2m3fn": (8, "float"),
    "float6_e3m2fn": (8, "float"),
    "int4": (8, "int"),
    "uint4": (8, "int"),
    "int2": (8, "int"),
    "uint2": (8, "int"),
}
"""numpy dtype name -> (storage bits, ``"float"`` or ``"int"``)."""

ROUND_MODES: frozenset[str] = frozenset({"up", "down", "nearest"})
"""Values of ONNX ``Cast``'s ``round_mode`` (only ``float8_e8m0fnu`` uses it)."""

_F32_SIGN = 0x8000_0000
_F32_ABS = 0x7FFF_FFFF
_F32_INF = 0x7F80_0000
_F32_QNAN = 0x7FC0_0000


@dataclass(frozen=True)
class _MiniFloat:
    """A sign/exponent/mantissa format narrower than float32 (all but bf16 and e8m0).

    ``special`` says where inf and NaN live:
    ``"ieee"`` all-ones exponent: inf (mantissa 0) and NaN (e5m2);
    ``"fn"``   no inf, NaN is the all-ones magnitude (e4m3fn);
    ``"fnuz"`` no inf, no -0, NaN is the -0 pattern 0x80 (e4m3fnuz, e5m2fnuz);
    ``"none"`` no inf, no NaN: everything finite (float4, float6).
    """

    exp_bits: int
    man_bits: int
    bias: int
    special: str

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exp_bits + self.man_bits)

    @property
    def max_code(self) -> int:
        """The magnitude bits of the largest finite value."""
        top = self.sign_bit - 1
        return {"ieee": top - (1 << self.man_bits), "fn": top - 1}.get(self.special, top)

    @property
    def inf_code(self) -> int:
        return self.sign_bit - (1 << self.man_bits)


_MINIFLOATS: dict[str, _MiniFloat] = {
    "float8_e4m3fn": _MiniFloat(4, 3, 7, "fn"),
    "float8_e4m3fnuz": _MiniFloat(4, 3, 8, "fnuz"),
    "float8_e5m2": _MiniFloat(5, 2, 15, "ieee"),
    "float8_e5m2fnuz": _MiniFloat(5, 2, 16, "fnuz"),
    "float4_e2m1fn": _MiniFloat(2, 1, 1, "none"),
    "float6_e2m3fn": _MiniFloat(2, 3, 1, "none"),
    "float6_e3m2fn": _MiniFloat(3, 2, 3, "none"),
}

_SMALL_INTS: dict[str, tuple[int, bool]] = {  # name -> (value bits, signed)
    "int4": (4, True),
    "uint4": (4, False),
    "int2": (2, True),
    "uint2": (2, False),
}


# --------------------------------------------------------------------------------------
# A builder wrapper that makes constants of the right shape (scalar or <N x T>).
# --------------------------------------------------------------------------------------


class _Ops:
    def __init__(self, builder: ir.IRBuilder, like: ir.Value):
        self.b = builder
        self.lanes = like.type.count if isinstance(like.type, ir.VectorType) else 0

    def ty(self, elem: ir.Type) -> ir.Type:
        return ir.VectorType(elem, self.lanes) if self.lanes else elem

    def k(self, elem: ir.Type, value: float | int) -> ir.Constant:
        scalar = ir.Constant(elem, value)
        return ir.Constant(self.ty(elem), [scalar] * self.lanes) if self.lanes else scalar

    def i32(self, value: int) -> ir.Constant:
        value = (value + (1 << 31)) % (1 << 32) - (1 << 31)  # as a signed 32-bit number
        return self.k(ir.IntType(32), value)

    def f32(self, value: float) -> ir.Constant:
        return self.k(ir.FloatType(), value)

    def to_i32(self, raw: ir.Value) -> ir.Value:
        return self.b.zext(raw, self.ty(ir.IntType(32)))

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.ty(ir.IntType(32)))

    def float_of(self, bits: ir.Value) -> ir.Value:
        return self.b.bitcast(bits, self.ty(ir.FloatType()))

    def cmp(self, op: str, a: ir.Value, b: int) -> ir.Value:
        return self.b.icmp_unsigned(op, a, self.i32(b))

    def sel(self, cond: ir.Value, a: ir.Value | int, b: ir.Value | int) -> ir.Value:
        a = self.i32(a) if isinstance(a, int) else a
        b = self.i32(b) if isinstance(b, int) else b
        return self.b.select(cond, a, b)

    def and_(self, a: ir.Value, m: int) -> ir.Value:
        return self.b.and_(a, self.i32(m))

    def or_(self, a: ir.Value, m: ir.Value | int) -> ir.Value:
        return self.b.or_(a, self.i32(m) if isinstance(m, int) else m)

    def shl(self, a: ir.Value, n: int) -> ir.Value:
        return self.b.shl(a, self.i32(n))

    def lshr(self, a: ir.Value, n: int) -> ir.Value:
        return self.b.lshr(a, self.i32(n))

    def add(self, a: ir.Value, m: ir.Value | int) -> ir.Value:
        return self.b.add(a, self.i32(m) if isinstance(m, int) else m)


def _elem(t: ir.Type) -> ir.Type:
    return t.element if isinstance(t, ir.VectorType) else t


def _kind(dtype: str) -> tuple[int, str]:
    try:
        return SMALL_DTYPES[dtype]
    except KeyError:
        known = ", ".join(SMALL_DTYPES)
        raise CodegenError(f"{dtype!r} is not a small storage dtype (known: {known})") from None


# --------------------------------------------------------------------------------------
# Decode: raw storage bits -> float / i8.
# --------------------------------------------------------------------------------------


def emit_decode(builder: ir.IRBuilder, raw: ir.Value, dtype: str) -> ir.Value:
    """Widen ``raw`` (``iK`` or ``<N x iK>`` as loaded) of storage type ``dtype``.

    Float kinds give ``float``/``<N x float>`` (exact; NaN stays NaN), int kinds give
    ``i8``/``<N x i8>``, sign-extended from the value bits for ``int4``/``int2`` and
    zero-extended for ``uint4``/``uint2``.  Bits above the value bits of an unpacked byte
    are ignored, except that float4/float6 read the sign as "any bit above the magnitude
    set", as ml_dtypes does.
    """
    bits, kind = _kind(dtype)
    width = _elem(raw.type)
    if not isinstance(width, ir.IntType) or width.width != bits:
        raise CodegenError(f"decoding {dtype} needs i{bits} storage values, got {raw.type}")
    ops = _Ops(builder, raw)
    if kind == "int":
        return _decode_int(ops, raw, *_SMALL_INTS[dtype])
    if dtype == "bfloat16":
        return ops.float_of(ops.shl(ops.to_i32(raw), 16))
    if dtype == "float8_e8m0fnu":
        return _decode_e8m0(ops, raw)
    return _decode_minifloat(ops, raw, _MINIFLOATS[dtype])


def _decode_int(ops: _Ops, raw: ir.Value, nbits: int, signed: bool) -> ir.Value:
    b, i8 = ops.b, ir.IntType(8)
    if signed:
        shift = ops.k(i8, 8 - nbits)
        return b.ashr(b.shl(raw, shift), shift)
    return b.and_(raw, ops.k(i8, (1 << nbits) - 1))


def _decode_e8m0(ops: _Ops, raw: ir.Value) -> ir.Value:
    """2^(raw - 127); raw 0 is 2^-127 (a float32 subnormal), raw 0xFF is NaN."""
    x = ops.to_i32(raw)
    out = ops.sel(ops.cmp("==", x, 0), 0x0040_0000, ops.shl(x, 23))
    return ops.float_of(ops.sel(ops.cmp("==", x, 0xFF), _F32_QNAN, out))


def _decode_minifloat(ops: _Ops, raw: ir.Value, fmt: _MiniFloat) -> ir.Value:
    b, m = ops.b, fmt.man_bits
    x = ops.to_i32(raw)
    mag = ops.and_(x, fmt.sign_bit - 1)
    negative = ops.cmp(">", x, fmt.sign_bit - 1)
    # Normal numbers: move exponent and mantissa into place and rebias the exponent.
    normal = ops.add(ops.shl(mag, 23 - m), (127 - fmt.bias) << 23)
    # Subnormals (exponent field 0, mag < 2^m): mantissa * 2^(1 - bias - m), both exact.
    scale = 2.0 ** (1 - fmt.bias - m)
    sub = ops.bits(b.fmul(b.uitofp(mag, ops.ty(ir.FloatType())), ops.f32(scale)))
    out = ops.sel(ops.cmp("<", mag, 1 << m), sub, normal)
    if fmt.special == "ieee":
        out = ops.sel(ops.cmp("==", mag, fmt.inf_code), _F32_INF, out)
        out = ops.sel(ops.cmp(">", mag, fmt.inf_code), _F32_QNAN, out)
    elif fmt.special == "fn":
        out = ops.sel(ops.cmp("==", mag, fmt.sign_bit - 1), _F32_QNAN, out)
    out = ops.or_(out, ops.sel(negative, _F32_SIGN, 0))
    if fmt.special == "fnuz":  # the -0 pattern is the (only) NaN
        out = ops.sel(ops.cmp("==", x, fmt.sign_bit), _F32_QNAN, out)
    return ops.float_of(out)


# --------------------------------------------------------------------------------------
# Encode: float / integer -> raw storage bits.
# --------------------------------------------------------------------------------------


def emit_encode(
    builder: ir.IRBuilder,
    value: ir.Value,
    dtype: str,
    saturate: bool = True,
    *,
    round_mode: str = "up",
) -> ir.Value:
    """Narrow ``value`` to the raw storage bits (``iK``/``<N x iK>``) of ``dtype``.

    ONNX ``Cast`` semantics, as ``onnx.reference`` computes them:

    * float kinds take ``half``/``float``/``double`` (scalar or vector), rounded once to
      nearest even (``double`` through float32 rounded to odd), as ml_dtypes 0.7 does;
      ``float8_e8m0fnu`` rounds ``double`` to float32 first, as its reference does.
      ``saturate`` matters only for the float8 types (ONNX's ``saturate`` attribute):
      True clamps overflow and ±inf to ±max finite, False gives inf (e5m2) or NaN
      (e4m3fn; fnuz: 0x80).  float4/float6 always saturate; bfloat16 overflows to inf.
      NaN becomes the type's quiet NaN (sign kept where the type has a signed NaN);
      float4/float6 have none and (like ml_dtypes) give the zero of the opposite sign.
      ``float8_e8m0fnu`` follows ``numpy_helper.to_float8e8m0`` with ``round_mode``
      (``"up"``, the ONNX default, ``"down"`` or ``"nearest"``); no other type reads
      ``round_mode``.
    * int kinds take an integer (any width: the low bits are kept, i.e. two's complement
      wrap-around, as ml_dtypes/numpy ``astype``) or a float (truncated toward zero, then
      0 where that is outside the type's range, as ml_dtypes 0.7 gives: ONNX leaves
      out-of-range float -> int casts undefined).  The result
      byte holds the value bits only (``int4`` -3 is 0x0D, as numpy stores it).
      ``saturate`` does not apply.
    """
    bits, kind = _kind(dtype)
    if round_mode not in ROUND_MODES:
        raise CodegenError(f"round_mode must be one of {sorted(ROUND_MODES)}, not {round_mode!r}")
    ops = _Ops(builder, value)
    elem = _elem(value.type)
    if kind == "int":
        return _encode_int(ops, value, *_SMALL_INTS[dtype])
    if isinstance(elem, ir.DoubleType) and dtype == "float8_e8m0fnu":
        value = builder.fptrunc(value, ops.ty(ir.FloatType()))  # the reference rounds twice
    elif isinstance(elem, ir.DoubleType):
        value = to_float32_odd(ops, value)
    elif isinstance(elem, ir.HalfType):
        value = builder.fpext(value, ops.ty(ir.FloatType()))
    elif not isinstance(elem, ir.FloatType):
        raise CodegenError(f"encoding {dtype} needs a half/float/double value, got {value.type}")
    u = ops.bits(value)
    if dtype == "bfloat16":
        out = _encode_bf16(ops, u)
    elif dtype == "float8_e8m0fnu":
        out = _encode_e8m0(ops, u, saturate, round_mode)
    else:
        out = _encode_minifloat(ops, u, _MINIFLOATS[dtype], saturate)
    return builder.trunc(out, ops.ty(ir.IntType(bits)))


def _encode_int(ops: _Ops, value: ir.Value, nbits: int, signed: bool) -> ir.Value:
    """Keep the low ``nbits`` of an integer (two's complement wrap-around, for both
    signednesses); a float is truncated, and 0 where that is outside the type's range."""
    b, elem = ops.b, _elem(value.type)
    i8, i32 = ir.IntType(8), ir.IntType(32)
    if isinstance(elem, ir.IntType):
        if elem.width > 8:
            byte = b.trunc(value, ops.ty(i8))
        elif elem.width < 8:
            byte = b.zext(value, ops.ty(i8))
        else:
            byte = value
    elif isinstance(elem, ir.HalfType | ir.FloatType | ir.DoubleType):
        if isinstance(elem, ir.HalfType):  # exact; and 2^31 is no half constant
            value, elem = b.fpext(value, ops.ty(ir.FloatType())), ir.FloatType()
        # fptosi of NaN or a value outside i32 is poison: zero those lanes first.  ml_dtypes
        # (x86-64) gives 0 for NaN, ±inf and x outside (-2^31, 2^31 - 1] (0x80000000's low
        # bits); float32 values at most 2^31 - 128 fit, doubles at most 2^31 - 1.
        top = 2.0**31 - 1 if isinstance(elem, ir.DoubleType) else 2.0**31 - 128
        inside = b.and_(
            b.fcmp_ordered("<=", value, ops.k(elem, top)),
            b.fcmp_ordered(">", value, ops.k(elem, -(2.0**31))),
        )
        whole = b.fptosi(b.select(inside, value, ops.k(elem, 0.0)), ops.ty(i32))
        byte = b.trunc(_zero_outside(ops, whole, nbits, signed), ops.ty(i8))
    else:
        raise CodegenError(f"cannot encode a {value.type} value as a small integer")
    return b.and_(byte, ops.k(i8, (1 << nbits) - 1))


def float32_odd(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """A float64 value (scalar or vector) as float32 rounded to odd (see to_float32_odd)."""
    return to_float32_odd(_Ops(builder, x), x)


def to_float32_odd(ops: _Ops, x: ir.Value) -> ir.Value:
    """float64 -> float32 rounded to odd: an inexact result is the odd one of the two
    float32 values around ``x``. float32 keeps 8 bits more than any narrower type here, so
    rounding it once more gives what one rounding of ``x`` would (as ml_dtypes 0.7 does)."""
    b, zero = ops.b, ops.k(_elem(x.type), 0.0)
    near = b.fptrunc(x, ops.ty(ir.FloatType()))  # to nearest even
    back = b.fpext(near, x.type)
    bits = ops.bits(near)
    fix = b.and_(b.fcmp_ordered("!=", back, x), ops.cmp("==", ops.and_(bits, 1), 0))
    # sign and magnitude: one step of the integer bits moves away from zero
    away = b.fcmp_ordered(
        "<", *(b.select(b.fcmp_ordered("<", v, zero), b.fneg(v), v) for v in (back, x))
    )
    return ops.float_of(b.select(fix, ops.add(bits, ops.sel(away, 1, -1)), bits))


def _zero_outside(ops: _Ops, whole: ir.Value, nbits: int, signed: bool) -> ir.Value:
    """``whole`` where it fits ``nbits`` (signed or not), else 0: ml_dtypes 0.7's result
    for a float outside a small int type's range (ONNX leaves it undefined)."""
    b, i32 = ops.b, ir.IntType(32)
    low, high = (-(1 << (nbits - 1)), (1 << (nbits - 1)) - 1) if signed else (0, (1 << nbits) - 1)
    fits = b.and_(
        b.icmp_signed(">=", whole, ops.k(i32, low)), b.icmp_signed("<=", whole, ops.k(i32, high))
    )
    return b.select(fits, whole, ops.k(i32, 0))


def _encode_bf16(ops: _Ops, u: ir.Value) -> ir.Value:
    """Round to nearest even on the bits; overflow carries into inf; NaN -> sign|0x7FC0."""
    odd = ops.and_(ops.lshr(u, 16), 1)
    rounded = ops.lshr(ops.add(ops.add(u, 0x7FFF), odd), 16)
    nan = ops.or_(ops.and_(ops.lshr(u, 16), 0x8000), 0x7FC0)
    return ops.sel(ops.cmp(">", ops.and_(u, _F32_ABS), _F32_INF), nan, rounded)


def _encode_e8m0(ops: _Ops, u: ir.Value, saturate: bool, round_mode: str) -> ir.Value:
    """``onnx.numpy_helper.to_float8e8m0``: the float32 exponent field, maybe plus one.

    The sign is ignored (ONNX leaves negative inputs unspecified); NaN and ±inf give 0xFF
    (NaN); 0 and float32 subnormals keep exponent field 0 (2^-127) unless rounded up.
    """
    b = ops.b
    exp = ops.and_(ops.lshr(u, 23), 0xFF)
    frac = ops.and_(u, 0x7F_FFFF)
    if round_mode == "up":
        bump = ops.cmp("!=", frac, 0)
    elif round_mode == "nearest":  # half (bit 22) and (anything below, or exponent > 0)
        rest = b.or_(ops.cmp("!=", ops.and_(u, 0x3F_FFFF), 0), ops.cmp("!=", exp, 0))
        bump = b.and_(ops.cmp("!=", ops.and_(u, 0x40_0000), 0), rest)
    else:
        bump = None
    out = exp
    if bump is not None:
        if saturate:  # never round 2^127 up into the NaN code
            bump = b.and_(bump, ops.cmp("!=", exp, 0xFE))
        out = ops.add(exp, b.zext(bump, ops.ty(ir.IntType(32))))
    return ops.sel(ops.cmp("==", exp, 0xFF), 0xFF, out)


def _encode_minifloat(ops: _Ops, u: ir.Value, fmt: _MiniFloat, saturate: bool) -> ir.Value:
    b, m = ops.b, fmt.man_bits
    a = ops.and_(u, _F32_ABS)
    negative = ops.lshr(u, 31)
    shift = 23 - m
    # Normal targets: rebias the exponent, round to nearest even on the bits (add half an
    # ulp minus one, plus the kept lsb), drop the extra mantissa bits.  Exceeds max_code
    # on overflow (and for inf/NaN, which are replaced below).
    lsb = ops.and_(ops.lshr(a, shift), 1)
    rebias = ((fmt.bias - 127) << 23) + (1 << (shift - 1)) - 1
    normal = ops.lshr(ops.add(ops.add(a, rebias), lsb), shift)
    # Subnormal targets (|x| < 2^(1 - bias)): adding 2^(1 - bias - m + 23), whose ulp is the
    # target's subnormal step, rounds |x| to nearest even in one float add; the mantissa
    # bits of the sum are the result (2^m, the smallest normal, when it rounds up).
    magic = 2.0 ** (1 - fmt.bias - m + 23)
    magic_bits = (127 + 1 - fmt.bias - m + 23) << 23
    summed = ops.bits(b.fadd(ops.float_of(a), ops.f32(magic)))
    sub = ops.add(summed, -magic_bits)
    mag = ops.sel(ops.cmp("<", a, (128 - fmt.bias) << 23), sub, normal)
    over = ops.cmp(">", mag, fmt.max_code)
    if saturate or fmt.special == "none":
        mag = ops.sel(over, fmt.max_code, mag)
    elif fmt.special == "ieee":
        mag = ops.sel(over, fmt.inf_code, mag)
    elif fmt.special == "fn":
        mag = ops.sel(over, fmt.sign_bit - 1, mag)
    sign = ops.shl(negative, fmt.exp_bits + m)
    if fmt.special == "fnuz":  # no -0: a zero result is +0; 0x80 is NaN
        sign = ops.sel(ops.cmp("==", mag, 0), 0, sign)
    out = ops.or_(mag, sign)
    if fmt.special == "fnuz" and not saturate:
        out = ops.sel(over, fmt.sign_bit, out)
    # NaN inputs.
    if fmt.special == "ieee":
        nan = ops.or_(sign, fmt.inf_code | 1 << (m - 1))  # quiet NaN, e5m2: 0x7E
    elif fmt.special == "fn":
        nan = ops.or_(sign, fmt.sign_bit - 1)
    elif fmt.special == "fnuz":
        nan = ops.i32(fmt.sign_bit)
    else:  # ml_dtypes: no NaN, gives the zero whose sign is the opposite of the NaN's
        nan = ops.shl(b.xor(negative, ops.i32(1)), fmt.exp_bits + m)
    return ops.sel(ops.cmp(">", a, _F32_INF), nan, out)
