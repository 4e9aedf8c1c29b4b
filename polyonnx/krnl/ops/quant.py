"""Linear quantisation: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, QLinearMatMul and QLinearConv.

Quantising is one elementwise statement; the scale and zero point are read per tensor
(a literal when constant), per axis (``[x_axis]``) or per block (``[.., floor(x_axis/B), ..]``,
an isl integer division)::

    QuantizeLinear:   y = saturate(round_half_even(x / scale) + zero_point)
    DequantizeLinear: y = (x - zero_point) * scale

The division runs in the scale's dtype (or the ``precision`` attribute's); rounding,
adding the zero point and saturating run in float32 (float64 for 32-bit results), and a
NaN saturates to the low end, as onnxruntime and the reference do. ``x - zero_point`` is
exact in a wider integer type before it is scaled.

The integer contractions accumulate ``(a - a_zero) * (b - b_zero)`` in int32 (wrapping,
as the spec allows); QLinear* then requantise each sum once::

    S0: acc[..] = 0                             (QLinearConv: the int32 bias)
    S1: acc[..] += (A[..k] - a_zero) * (B[k..] - b_zero)
    S2: y[..] = saturate(round_half_even(acc * (a_scale * b_scale / y_scale) + y_zero))

with the multiplier computed in the scales' dtype and the product in float64, as the ONNX
reference does. DynamicQuantizeLinear finds the range with two reductions, then writes
scale, zero point and data.

The formulas are written per dtype family, not per dtype: narrow integers (int4, int2)
saturate to :data:`INT_RANGES` like int8; narrow floats (float8, float4, float6) are
clamped to :data:`FLOAT_MAX` when ``saturate`` is set and rounded by the cast, and
DequantizeLinear ignores their (zero) zero point, as the reference does; bfloat16 and
other narrow scales are computed in float32. A dtype the runtime does not store is
refused with a LoweringError naming the node and the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import DTYPES, Buffer, Expr, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.conv import channels, contraction, kernel_shape, window
from polyonnx.krnl.ops.elementwise import ONNX_DTYPES

INT_RANGES = {
    "int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
    "int32": (-(2**31), 2**31 - 1), "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1),
    "uint2": (0, 3),
}  # fmt: skip
"""Saturation bounds of the integer quantised types."""

FLOAT_MAX = {
    "float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0, "float4_e2m1fn": 6.0, "float6_e2m3fn": 7.5,
    "float6_e3m2fn": 28.0,
}  # fmt: skip
"""The largest finite value of the small float quantised types (saturate clamps to it)."""

MORE_DTYPES = {
    16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2",
    20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn",
    24: "float8_e8m0fnu", 25: "uint2", 26: "int2", 27: "float6_e2m3fn", 28: "float6_e3m2fn",
}  # fmt: skip
"""ONNX element types beyond :data:`ONNX_DTYPES`, by name (for attributes and errors)."""

NATIVE_FLOATS = ("float16", "float32", "float64")
"""Floats arithmetic runs in; narrower ones (bfloat16, float8…) are computed in float32."""


def _where(node: Node) -> str:
    return f"{node.op_type} node {node.name!r}"


def _supported(node: Node, dtype: str, what: str) -> str:
    """``dtype`` if the runtime has it; otherwise a clear refusal."""
    if dtype not in DTYPES:
        raise LoweringError(
            f"{_where(node)}: {what} has dtype {dtype}, which the runtime does not support"
        )
    return dtype


def _dtype_attr(node: Node, name: str) -> str | None:
    """An ONNX element type attribute (``output_dtype``, ``precision``) as a dtype name."""
    code = int(node.attr(name, 0) or 0)
    if not code:
        return None
    dtype = ONNX_DTYPES.get(code) or MORE_DTYPES.get(code)
    if dtype is None:
        raise LoweringError(f"{_where(node)}: {name}={code} is not a known element type")
    return _supported(node, dtype, f"{name} ({code})")


def _quantised(node: Node, dtype: str, what: str) -> str:
    _supported(node, dtype, what)
    if dtype not in INT_RANGES and dtype not in FLOAT_MAX:
        raise LoweringError(f"{_where(node)}: {what} has dtype {dtype}, not a quantised type")
    return dtype


def _read(ctx: LowerContext, name: str, stmt: str, dims: Sequence[str], index: Sequence[str]):
    """``name`` at ``index``; a constant with one element is a literal instead."""
    value = ctx.constant(name)
    if value is not None and value.size == 1:
        return kb.const(value.reshape(()).item(), value.dtype.name)
    return kb.load(kb.access(name, stmt, dims, index), ctx.buffer(name).dtype)


def saturate(value: Expr, dtype: str) -> Expr:
    """A rounded float ``value`` clamped into integer ``dtype`` (NaN → its low end) and
    converted; a small float is clamped to ±its largest finite value (NaN stays NaN)."""
    if dtype in FLOAT_MAX:
        top = FLOAT_MAX[dtype]
        value = kb.binary(
            "min", kb.binary("max", value, kb.const(-top, value.dtype)), kb.const(top, value.dtype)
        )
        return kb.cast(value, dtype)
    lo, hi = INT_RANGES[dtype]
    clamped = kb.binary(
        "min", kb.binary("max", value, kb.const(lo, value.dtype)), kb.const(hi, value.dtype)
    )
    nan = kb.unary("isnan", value, "bool")
    return kb.cast(kb.select(nan, kb.const(lo, value.dtype), clamped), dtype)


def _precision(node: Node, scale: Buffer) -> str:
    """Where ``x / scale`` is computed: the ``precision`` attribute's dtype, else the
    scale's; float32 for narrower floats, float64 for an int32 scale."""
    dtype = _dtype_attr(node, "precision") or scale.dtype
    if dtype in NATIVE_FLOATS:
        return dtype
    return "float32" if is_float(dtype) else "float64"


def _wide_float(dtype: str, *others: str) -> str:
    """float32 arithmetic holds every value of 8- and 16-bit types exactly; 32-bit ones
    (and float64 operands) need float64."""
    wide = {"int32", "uint32", "float64"}
    return "float64" if dtype in wide or any(o in wide for o in others) else "float32"


# ---- quantisation layout ----------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How a scale (and its zero point) covers ``x``: per tensor, per axis or per block."""

    mode: str  # "tensor" | "axis" | "block"
    axis: int = 0
    block: int = 0

    def index(self, dims: Sequence[str], param: Buffer) -> list[str]:
        """The index of ``param`` (the scale or zero point) at the point ``dims`` of x."""
        if self.mode == "tensor":  # (a scalar, or any shape holding one element)
            return ["0"] * len(param.shape)
        if self.mode == "axis":
            return [dims[self.axis]]
        return [f"floor({d}/{self.block})" if r == self.axis else d for r, d in enumerate(dims)]


def layout(node: Node, x: Sequence[int], scale: Buffer, block: int = 0) -> Layout:
    """The layout of ``scale`` over an ``x`` of shape ``x`` (``axis`` defaults to 1)."""
    shape = scale.shape
    if scale.size == 1:
        return Layout("tensor")
    axis = kb.normalize_axis(node.attr("axis", 1), len(x), _where(node)) if x else 0
    if block > 0:
        expected = [-(-n // block) if r == axis else n for r, n in enumerate(x)]
        if list(shape) != expected:
            raise LoweringError(
                f"{_where(node)}: blocked scale of shape {list(shape)} does not fit x of shape "
                f"{list(x)} with axis {axis} and block_size {block} (expected {expected})"
            )
        return Layout("block", axis, block)
    if len(shape) != 1 or shape[0] != x[axis]:
        raise LoweringError(
            f"{_where(node)}: scale of shape {list(shape)} is neither a scalar nor a vector of "
            f"the {x[axis] if x else 0} entries of axis {axis} of x (shape {list(x)})"
        )
    return Layout("axis", axis)


def _zero_point(ctx: LowerContext, node: Node, index: int, scale: Buffer) -> Buffer | None:
    name = node.input(index)
    if not name:
        return None
    zero = ctx.buffer(name)
    if zero.shape != scale.shape and not (zero.size == 1 and scale.size == 1):
        raise LoweringError(
            f"{_where(node)}: zero point of shape {list(zero.shape)} and scale of shape "
            f"{list(scale.shape)} differ"
        )
    return zero


def _block_size(node: Node) -> int:
    block = int(node.attr("block_size", 0) or 0)
    if block < 0:
        raise LoweringError(f"{_where(node)}: block_size {block} must be positive")
    return block


# ---- QuantizeLinear, DequantizeLinear ----------------------------------------------------


@lowers("QuantizeLinear")
def lower_quantize_linear(ctx: LowerContext, node: Node) -> None:
    x, scale = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    _supported(node, x.dtype, "x")
    _supported(node, scale.dtype, "y_scale")
    zero = _zero_point(ctx, node, 2, scale)
    wanted = _dtype_attr(node, "output_dtype")
    out_dtype = zero.dtype if zero is not None else wanted or "uint8"
    if zero is not None and wanted is not None and wanted != zero.dtype:
        raise LoweringError(
            f"{_where(node)}: output_dtype {wanted} differs from the zero point's {zero.dtype}"
        )
    _quantised(node, out_dtype, "y")
    lay = layout(node, x.shape, scale, _block_size(node))
    precision = _precision(node, scale)
    saturating = bool(int(node.attr("saturate", 1)))

    dims = kb.dims("d", len(x.shape))

    def body(stmt: str) -> Expr:
        xs = kb.load(kb.access(x.name, stmt, dims, dims), x.dtype)
        ratio = kb.binary(
            "div",
            kb.cast(xs, precision),
            kb.cast(_read(ctx, scale.name, stmt, dims, lay.index(dims, scale)), precision),
        )
        if out_dtype in FLOAT_MAX:  # the cast rounds; zero points of float types are 0
            value = ratio
            if zero is not None:
                value = kb.binary(
                    "add",
                    value,
                    kb.cast(_read(ctx, zero.name, stmt, dims, lay.index(dims, zero)), precision),
                )
            if saturating:
                return saturate(value, out_dtype)
            return kb.cast(value, out_dtype, False)  # overflow gives inf or NaN
        wide = _wide_float(out_dtype, precision)
        value = kb.unary("round", kb.cast(ratio, wide))
        if zero is not None:
            value = kb.binary(
                "add",
                value,
                kb.cast(_read(ctx, zero.name, stmt, dims, lay.index(dims, zero)), wide),
            )
        return saturate(value, out_dtype)

    out = ctx.output(node.outputs[0], x.shape, out_dtype)
    write = kb.access(out.name, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, x.shape), write, body("S0"))])


@lowers("DequantizeLinear")
def lower_dequantize_linear(ctx: LowerContext, node: Node) -> None:
    x, scale = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    _quantised(node, x.dtype, "x")
    _supported(node, scale.dtype, "x_scale")
    zero = _zero_point(ctx, node, 2, scale)
    if zero is not None and zero.dtype != x.dtype:
        raise LoweringError(
            f"{_where(node)}: zero point dtype {zero.dtype} differs from x's {x.dtype}"
        )
    out_dtype = _dtype_attr(node, "output_dtype") or scale.dtype
    if out_dtype not in (*NATIVE_FLOATS, "bfloat16"):
        raise LoweringError(
            f"{_where(node)}: output dtype {out_dtype} is not float32, float16 or bfloat16"
        )
    lay = layout(node, x.shape, scale, _block_size(node))
    wide = _wide_float(x.dtype, scale.dtype, out_dtype)
    dims = kb.dims("d", len(x.shape))
    xs: Expr = kb.load(kb.access(x.name, "S0", dims, dims), x.dtype)
    if x.dtype in INT_RANGES:
        diff_dtype = "int64" if wide == "float64" else "int32"
        xs = kb.cast(xs, diff_dtype)
        if zero is not None:
            xs = kb.binary(
                "sub",
                xs,
                kb.cast(_read(ctx, zero.name, "S0", dims, lay.index(dims, zero)), diff_dtype),
            )
    # (a float8 zero point must be 0: the reference ignores it)
    value = kb.binary(
        "mul",
        kb.cast(xs, wide),
        kb.cast(_read(ctx, scale.name, "S0", dims, lay.index(dims, scale)), wide),
    )
    out = ctx.output(node.outputs[0], x.shape, out_dtype)
    write = kb.access(out.name, "S0", dims, dims)
    ctx.kernel(
        node, [Statement("S0", kb.box("S0", dims, x.shape), write, kb.cast(value, out_dtype))]
    )


# ---- DynamicQuantizeLinear --------------------------------------------------------------


@lowers("DynamicQuantizeLinear")
def lower_dynamic_quantize_linear(ctx: LowerContext, node: Node) -> None:
    """``hi = max(0, max x)``, ``lo = min(0, min x)``, ``scale = (hi - lo) / 255`` (1 when
    hi == lo, as onnxruntime does), ``zero = round(clamp(-lo / scale, 0, 255))``, then
    ``y = saturate(round(x / scale) + zero)`` into uint8."""
    x = ctx.buffer(node.inputs[0])
    if not is_float(x.dtype):
        raise LoweringError(f"{_where(node)}: x has dtype {x.dtype}; only floats are quantised")
    acc = _wide_float(x.dtype)
    dims, shape = kb.dims("d", len(x.shape)), x.shape
    names = [*node.outputs, "", ""][:3]
    y = ctx.output(names[0], shape, "uint8")
    scale = (
        ctx.output(names[1], (), x.dtype) if names[1] else ctx.temp(y.name + ".scale", (), x.dtype)
    )
    zero = (
        ctx.output(names[2], (), "uint8") if names[2] else ctx.temp(y.name + ".zero", (), "uint8")
    )
    hi = ctx.temp(y.name + ".max", (), acc)
    lo = ctx.temp(y.name + ".min", (), acc)
    zero_f = ctx.temp(y.name + ".zerof", (), acc)

    def scalar(buf: Buffer, stmt: str, over: Sequence[str] = ()) -> Expr:
        return kb.load(kb.access(buf.name, stmt, over, []), buf.dtype)

    def x_at(stmt: str) -> Expr:
        return kb.cast(kb.load(kb.access(x.name, stmt, dims, dims), x.dtype), acc)

    def init(stmt: str, buf: Buffer, value: Expr) -> Statement:
        return Statement(stmt, kb.box(stmt, [], []), kb.access(buf.name, stmt, [], []), value)

    def over_x(stmt: str, buf: Buffer, value: Expr, op: str | None) -> Statement:
        write = kb.access(buf.name, stmt, dims, dims if buf is y else [])
        return Statement(stmt, kb.box(stmt, dims, shape), write, value, op)

    zero_c, top = kb.const(0, acc), kb.const(255, acc)
    span = kb.binary("sub", scalar(hi, "S4"), scalar(lo, "S4"))
    flat = kb.binary("eq", scalar(hi, "S4"), scalar(lo, "S4"), "bool")
    step = kb.select(flat, kb.const(1, acc), kb.binary("div", span, top))
    centre = kb.binary(
        "sub", zero_c, kb.binary("div", scalar(lo, "S5"), _scale_at(scale, "S5", acc))
    )
    centre = kb.binary("min", kb.binary("max", centre, zero_c), top)
    quotient = kb.binary("div", x_at("S7"), _scale_at(scale, "S7", acc, dims))
    value = kb.binary("add", kb.unary("round", quotient), scalar(zero_f, "S7", dims))
    ctx.kernel(
        node,
        [
            init("S0", hi, zero_c),
            over_x("S1", hi, x_at("S1"), "max"),
            init("S2", lo, zero_c),
            over_x("S3", lo, x_at("S3"), "min"),
            init("S4", scale, kb.cast(step, x.dtype)),
            init("S5", zero_f, kb.unary("round", centre)),
            init("S6", zero, saturate(scalar(zero_f, "S6"), "uint8")),
            over_x("S7", y, saturate(value, "uint8"), None),
        ],
    )


def _scale_at(scale: Buffer, stmt: str, dtype: str, over: Sequence[str] = ()) -> Expr:
    return kb.cast(kb.load(kb.access(scale.name, stmt, over, []), scale.dtype), dtype)


# ---- MatMulInteger, QLinearMatMul ----------------------------------------------------------


@dataclass(frozen=True)
class Product:
    """numpy matmul geometry (batch broadcast, 1-D operands) of ``A @ B`` over dims
    ``out_dims + [k]``; ``a_index``/``b_index`` read the operands."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    out_dims: tuple[str, ...]
    out_shape: tuple[int, ...]
    a_index: tuple[str, ...]
    b_index: tuple[str, ...]
    k: int

    @property
    def full(self) -> list[str]:
        return [*self.out_dims, "k"]


def product(node: Node, a: tuple[int, ...], b: tuple[int, ...]) -> Product:
    if not a or not b:
        raise LoweringError(f"{_where(node)}: operands must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    (m, k), (k2, n) = a2[-2:], b2[-2:]
    if k != k2:
        raise LoweringError(f"{_where(node)}: inner dims differ, {list(a)} @ {list(b)}")
    try:
        batch = kb.broadcast_shape(a2[:-2], b2[:-2])
    except ValueError as exc:
        raise LoweringError(f"{_where(node)}: {exc}") from exc
    bdims = kb.dims("b", len(batch))
    keep_i, keep_j = len(a) > 1, len(b) > 1
    out_dims = [*bdims, *(["i"] if keep_i else []), *(["j"] if keep_j else [])]
    out_shape = [*batch, *([m] if keep_i else []), *([n] if keep_j else [])]
    i, j = ("i" if keep_i else "0"), ("j" if keep_j else "0")
    a_index = [*kb.broadcast_index(bdims, a2[:-2]), i, "k"] if len(a) > 1 else ["k"]
    b_index = [*kb.broadcast_index(bdims, b2[:-2]), "k", j] if len(b) > 1 else ["k"]
    return Product(a, b, tuple(out_dims), tuple(out_shape), tuple(a_index), tuple(b_index), k)


def side_index(
    node: Node,
    what: str,
    param: tuple[int, ...],
    operand: tuple[int, ...],
    index: Sequence[str],
    row: bool,
) -> list[str]:
    """Where a per-row (``row``, for A) or per-column (for B) parameter is read, given the
    operand's shape and index: a vector of the operand's rows (columns), or an N-D tensor
    that broadcasts against the operand with a 1 in its K dim."""
    if int(np.prod(param, dtype=np.int64)) == 1:
        return ["0"] * len(param)
    if len(operand) < 2:
        raise LoweringError(f"{_where(node)}: {what} must be a scalar for a 1-D operand")
    shaped = param
    if len(param) == 1:
        shaped = (param[0], 1) if row else (1, param[0])
    k_dim = len(shaped) - 1 if row else len(shaped) - 2
    lead = len(operand) - len(shaped)
    ok = (
        lead >= 0
        and shaped[k_dim] == 1
        and all(p in (1, operand[lead + r]) for r, p in enumerate(shaped))
    )
    if not ok:
        kind = "row" if row else "column"
        raise LoweringError(
            f"{_where(node)}: {what} of shape {list(param)} is neither a scalar nor per-{kind} "
            f"for an operand of shape {list(operand)}"
        )
    at = ["0" if p == 1 else index[lead + r] for r, p in enumerate(shaped)]
    if len(param) == 1:
        return [at[0] if row else at[1]]
    return at


def _integer_operand(node: Node, buf: Buffer, what: str) -> None:
    _supported(node, buf.dtype, what)
    if buf.dtype not in ("int8", "uint8"):
        raise LoweringError(f"{_where(node)}: {what} has dtype {buf.dtype}; int8 or uint8 expected")


def _centred(
    ctx: LowerContext,
    node: Node,
    buf: Buffer,
    zero_name: str,
    what: str,
    stmt: str,
    dims: Sequence[str],
    index: Sequence[str],
    zero_index,
) -> Expr:
    """``buf[index] - zero[zero_index]`` as int32 (the zero point is optional)."""
    value = kb.cast(kb.load(kb.access(buf.name, stmt, dims, index), buf.dtype), "int32")
    if not zero_name:
        return value
    zero = ctx.buffer(zero_name)
    if zero.dtype != buf.dtype:
        raise LoweringError(
            f"{_where(node)}: {what} zero point dtype {zero.dtype} differs from {buf.dtype}"
        )
    return kb.binary("sub", value, kb.cast(_read(ctx, zero_name, stmt, dims, zero_index), "int32"))


def _contraction(
    ctx: LowerContext,
    node: Node,
    acc: Buffer,
    p: Product,
    a: Buffer,
    b: Buffer,
    zeros: tuple[str, str],
) -> list[Statement]:
    """``acc = 0; acc += (A - a_zero) * (B - b_zero)`` in int32."""
    full = p.full
    terms = []
    for buf, zero, index, row in ((a, zeros[0], p.a_index, True), (b, zeros[1], p.b_index, False)):
        at = (
            side_index(node, "zero point", ctx.buffer(zero).shape, buf.shape, index, row)
            if zero
            else []
        )
        terms.append(_centred(ctx, node, buf, zero, buf.name, "S1", full, index, at))
    dims = list(p.out_dims)
    init = Statement(
        "S0",
        kb.box("S0", dims, p.out_shape),
        kb.access(acc.name, "S0", dims, dims),
        kb.const(0, "int32"),
    )
    update = Statement(
        "S1",
        kb.box("S1", full, [*p.out_shape, p.k]),
        kb.access(acc.name, "S1", full, dims),
        kb.binary("mul", *terms),
        "add",
    )
    return [init, update]


@lowers("MatMulInteger")
def lower_matmul_integer(ctx: LowerContext, node: Node) -> None:
    a, b = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    _integer_operand(node, a, "A")
    _integer_operand(node, b, "B")
    p = product(node, a.shape, b.shape)
    out = ctx.output(node.outputs[0], p.out_shape, "int32")
    ctx.kernel(node, _contraction(ctx, node, out, p, a, b, (node.input(2), node.input(3))))


def requantise(
    ctx: LowerContext,
    node: Node,
    acc: Buffer,
    out: Buffer,
    stmt: str,
    dims: Sequence[str],
    scales: Sequence[tuple[str, Sequence[str]]],
    y_zero: tuple[str, Sequence[str]],
) -> Statement:
    """``out = saturate(round(acc * (s_a * s_b / s_y) + y_zero))``: the multiplier in the
    scales' dtype, the rest in float64 (as the ONNX reference computes it)."""
    (sa, ia), (sb, ib), (sy, iy) = scales
    dtype = ctx.buffer(sa).dtype
    for name in (sa, sb, sy):
        scale = ctx.buffer(name)
        _supported(node, scale.dtype, f"scale {name!r}")
        if scale.dtype != dtype or not is_float(dtype):
            raise LoweringError(
                f"{_where(node)}: scales must share one float dtype, got {scale.dtype}"
            )
    multiplier = kb.binary(
        "div",
        kb.binary("mul", _read(ctx, sa, stmt, dims, ia), _read(ctx, sb, stmt, dims, ib)),
        _read(ctx, sy, stmt, dims, iy),
    )
    total = kb.cast(kb.load(kb.access(acc.name, stmt, dims, dims), "int32"), "float64")
    value = kb.binary("mul", total, kb.cast(multiplier, "float64"))
    zero_name, zero_index = y_zero
    if zero_name:
        value = kb.binary(
            "add", value, kb.cast(_read(ctx, zero_name, stmt, dims, zero_index), "float64")
        )
    body = saturate(kb.unary("round", value), out.dtype)
    return Statement(
        stmt, kb.box(stmt, dims, out.shape), kb.access(out.name, stmt, dims, dims), body
    )


def _output_index(
    node: Node, what: str, param: tuple[int, ...], dims: Sequence[str], shape: Sequence[int]
) -> list[str]:
    """A scalar, or a tensor that numpy-broadcasts against the output."""
    if int(np.prod(param, dtype=np.int64)) == 1:
        return ["0"] * len(param)
    try:
        if kb.broadcast_shape(param, shape) == tuple(shape):
            return kb.broadcast_index(dims, param)
    except ValueError:
        pass
    raise LoweringError(
        f"{_where(node)}: {what} of shape {list(param)} does not broadcast to the output's "
        f"shape {list(shape)}"
    )


@lowers("QLinearMatMul")
def lower_qlinear_matmul(ctx: LowerContext, node: Node) -> None:
    a, b = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[3])
    _integer_operand(node, a, "a")
    _integer_operand(node, b, "b")
    y_zero = node.input(7)
    out_dtype = ctx.buffer(y_zero).dtype if y_zero else a.dtype
    _quantised(node, out_dtype, "y")
    p = product(node, a.shape, b.shape)
    for scale, zero in ((1, 2), (4, 5), (6, 7)):
        s, z = ctx.buffer(node.input(scale)), node.input(zero)
        if z and ctx.buffer(z).shape != s.shape and ctx.buffer(z).size + s.size != 2:
            raise LoweringError(f"{_where(node)}: inputs {scale} and {zero} differ in shape")
    out = ctx.output(node.outputs[0], p.out_shape, out_dtype)
    acc = ctx.temp(out.name + ".acc", p.out_shape, "int32")
    stmts = _contraction(ctx, node, acc, p, a, b, (node.input(2), node.input(5)))
    dims = list(p.out_dims)
    # in S2 there is no k: per-row and per-column parameters have a 1 in their K dim
    a_at = [d if d in dims else "0" for d in p.a_index]
    b_at = [d if d in dims else "0" for d in p.b_index]
    a_scale = side_index(node, "a_scale", ctx.buffer(node.input(1)).shape, a.shape, a_at, True)
    b_scale = side_index(node, "b_scale", ctx.buffer(node.input(4)).shape, b.shape, b_at, False)
    y_shape = ctx.buffer(node.input(6)).shape
    y_at = _output_index(node, "y_scale", y_shape, dims, p.out_shape)
    y_zero_at = []
    if y_zero:
        y_zero_shape = ctx.buffer(y_zero).shape
        y_zero_at = _output_index(node, "y_zero_point", y_zero_shape, dims, p.out_shape)
    scales = [(node.input(1), a_scale), (node.input(4), b_scale), (node.input(6), y_at)]
    stmts.append(requantise(ctx, node, acc, out, "S2", dims, scales, (y_zero, y_zero_at)))
    ctx.kernel(node, stmts)


# ---- QLinearConv -------------------------------------------------------------------------


def _per_channel(ctx: LowerContext, node: Node, index: int, what: str, m: int) -> list[str]:
    """The index of a scalar or per-output-channel parameter, over dims ``n, m, ...``."""
    shape = ctx.buffer(node.input(index)).shape
    if int(np.prod(shape, dtype=np.int64)) == 1:
        return ["0"] * len(shape)
    if shape != (m,):
        raise LoweringError(
            f"{_where(node)}: {what} of shape {list(shape)} is neither a scalar nor one entry "
            f"per output channel ({m})"
        )
    return ["m"]


@lowers("QLinearConv")
def lower_qlinear_conv(ctx: LowerContext, node: Node) -> None:
    """Conv's reduction (padding taps are outside the domain, i.e. count as the zero
    point) into an int32 temp that starts at the bias, then :func:`requantise`."""
    x, w = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[3])
    _integer_operand(node, x, "x")
    _integer_operand(node, w, "w")
    ch = channels(node, x, w)
    axes = window(node, x.shape[2:], kernel_shape(node, w.shape[2:]))
    m = w.shape[0]
    out_shape = (x.shape[0], m, *(a.out for a in axes))
    y_zero = node.input(7)
    out_dtype = ctx.buffer(y_zero).dtype if y_zero else x.dtype
    _quantised(node, out_dtype, "y")
    for scalar in (1, 2, 6, 7):
        if node.input(scalar) and ctx.buffer(node.input(scalar)).size != 1:
            raise LoweringError(f"{_where(node)}: input {scalar} must be a scalar (per tensor)")
    out = ctx.output(node.outputs[0], out_shape, out_dtype)
    acc = ctx.temp(out.name + ".acc", out_shape, "int32")

    out_dims = ["n", "m", *kb.dims("o", ch.rank)]
    bias: Expr = kb.const(0, "int32")
    if node.input(8):
        b = ctx.buffer(node.input(8))
        if b.shape != (m,) or b.dtype != "int32":
            raise LoweringError(
                f"{_where(node)}: bias must be int32 of shape [{m}], got {b.dtype} {list(b.shape)}"
            )
        bias = kb.load(kb.access(b.name, "S0", out_dims, ["m"]), "int32")
    init = Statement(
        "S0", kb.box("S0", out_dims, out_shape), kb.access(acc.name, "S0", out_dims, out_dims), bias
    )

    dims, o, k = ch.dims(), ch.out_dims, ch.k_dims
    taps = [a.tap(o[r], k[r]) for r, a in enumerate(axes)]
    w_zero = node.input(5)
    w_zero_at = _per_channel(ctx, node, 5, "w_zero_point", m) if w_zero else []
    w_zero_at = [ch.m if i == "m" else i for i in w_zero_at]
    xs = _centred(
        ctx,
        node,
        x,
        node.input(2),
        "x",
        "S1",
        dims,
        ["n", ch.c, *taps],
        ["0"] * len(ctx.buffer(node.input(2)).shape) if node.input(2) else [],
    )
    ws = _centred(ctx, node, w, w_zero, "w", "S1", dims, [ch.m, "c", *k], w_zero_at)
    inside = [a.inside(o[r], k[r]) for r, a in enumerate(axes)]
    update = contraction(ch, x.shape[0], axes, acc, kb.binary("mul", xs, ws), inside)
    scalar_at = ["0"] * len(ctx.buffer(node.input(1)).shape)
    scales = [
        (node.input(1), scalar_at),
        (node.input(4), _per_channel(ctx, node, 4, "w_scale", m)),
        (node.input(6), ["0"] * len(ctx.buffer(node.input(6)).shape)),
    ]
    y_at = ["0"] * len(ctx.buffer(y_zero).shape) if y_zero else []
    final = requantise(ctx, node, acc, out, "S2", out_dims, scales, (y_zero, y_at))
    ctx.kernel(node, [init, update, final])
