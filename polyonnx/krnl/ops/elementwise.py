"""Elementwise ops: one statement over the broadcast output shape.

Each ONNX op maps to a small expression over its operands' loads; numpy broadcasting is
in the access maps (see :func:`polyonnx.krnl.build.broadcast_index`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce as fold

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Checked, CheckSite, Const, Expr, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers

ONNX_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
    17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
    21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2",
}  # fmt: skip


def elementwise(
    ctx: LowerContext,
    node: Node,
    inputs: Sequence[str],
    body: Callable[[list[Expr]], Expr],
    output: str | None = None,
) -> None:
    """Write ``body(operands)`` at every point of the broadcast shape of ``inputs``."""
    shape = kb.broadcast_shape(*(ctx.buffer(name).shape for name in inputs if name))
    dims = kb.dims("d", len(shape))
    operands = [ctx.operand(name, "S0", dims) for name in inputs]
    expr = body(operands)
    out = ctx.output(output or node.outputs[0], shape, expr.dtype)
    write = kb.access(out.name, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, shape), write, expr)])


# ---- unary -----------------------------------------------------------------------

UNARY = {
    "Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Tanh": "tanh",
    "Sigmoid": "sigmoid", "Erf": "erf", "Sin": "sin", "Cos": "cos", "Floor": "floor",
    "Ceil": "ceil", "Round": "round", "Sign": "sign", "Reciprocal": "reciprocal",
    "Not": "not", "Softplus": "softplus",
}  # fmt: skip


@lowers(*UNARY)
def lower_unary(ctx: LowerContext, node: Node) -> None:
    elementwise(ctx, node, node.inputs[:1], lambda xs: kb.unary(UNARY[node.op_type], xs[0]))


@lowers("Relu")
def lower_relu(ctx: LowerContext, node: Node) -> None:
    elementwise(ctx, node, node.inputs[:1], lambda xs: kb.binary("max", xs[0], _zero(xs[0])))


@lowers("LeakyRelu")
def lower_leaky_relu(ctx: LowerContext, node: Node) -> None:
    alpha = float(node.attr("alpha", 0.01))

    def body(xs: list[Expr]) -> Expr:
        x = xs[0]
        scaled = kb.binary("mul", x, kb.const(alpha, x.dtype))
        return kb.select(kb.binary("lt", x, _zero(x), "bool"), scaled, x)

    elementwise(ctx, node, node.inputs[:1], body)


@lowers("IsNaN")
def lower_isnan(ctx: LowerContext, node: Node) -> None:
    elementwise(ctx, node, node.inputs[:1], lambda xs: kb.unary("isnan", xs[0], "bool"))


@lowers("IsInf")
def lower_isinf(ctx: LowerContext, node: Node) -> None:
    pos, neg = int(node.attr("detect_positive", 1)), int(node.attr("detect_negative", 1))
    op = {(1, 1): "isinf", (1, 0): "isposinf", (0, 1): "isneginf"}.get((pos, neg))

    def body(xs: list[Expr]) -> Expr:
        if op is None:
            return kb.const(False, "bool")
        return kb.unary(op, xs[0], "bool")

    elementwise(ctx, node, node.inputs[:1], body)


@lowers("Cast")
def lower_cast(ctx: LowerContext, node: Node) -> None:
    to = ONNX_DTYPES.get(int(node.attr("to", 0)))
    if to is None:
        raise LoweringError(f"Cast node {node.name!r}: unsupported target type {node.attr('to')}")
    saturate = bool(int(node.attr("saturate", 1)))
    elementwise(ctx, node, node.inputs[:1], lambda xs: kb.cast(xs[0], to, saturate))


@lowers("Clip")
def lower_clip(ctx: LowerContext, node: Node) -> None:
    if node.opset < 11:
        lo, hi = node.attr("min"), node.attr("max")

        def body_attrs(xs: list[Expr]) -> Expr:
            x = xs[0]
            if lo is not None:
                x = kb.binary("max", x, kb.const(lo, x.dtype))
            if hi is not None:
                x = kb.binary("min", x, kb.const(hi, x.dtype))
            return x

        elementwise(ctx, node, node.inputs[:1], body_attrs)
        return
    present = [name for name in node.inputs[1:3] if name]
    has_lo, has_hi = bool(node.input(1)), bool(node.input(2))

    def body(xs: list[Expr]) -> Expr:
        x, bounds = xs[0], iter(xs[1:])
        if has_lo:
            x = kb.binary("max", x, next(bounds))
        if has_hi:
            x = kb.binary("min", x, next(bounds))
        return x

    elementwise(ctx, node, [node.inputs[0], *present], body)


# ---- binary and variadic -----------------------------------------------------------

BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
    "And": "and", "Or": "or", "Xor": "xor",
    "BitwiseAnd": "bitand", "BitwiseOr": "bitor", "BitwiseXor": "bitxor",
}  # fmt: skip
COMPARE = {
    "Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge",
}  # fmt: skip


def nonzero_divisor(node: Node, divisor: Expr) -> Expr:
    """An integer divisor a user gives, checked not to be zero at run time (the run raises
    RunError; the division itself never traps: emit/ops.py). A float divisor, or a nonzero
    constant, is left as it is."""
    if is_float(divisor.dtype) or (isinstance(divisor, Const) and divisor.value != 0):
        return divisor
    word = "division" if node.op_type == "Div" else "modulo"
    site = CheckSite(node.name, node.op_type, f"integer {word} by zero")
    zero = kb.const(0, divisor.dtype)
    return Checked(divisor.dtype, divisor, kb.binary("ne", divisor, zero, "bool"), site)


@lowers(*BINARY)
def lower_binary(ctx: LowerContext, node: Node) -> None:
    op = BINARY[node.op_type]

    def body(xs: list[Expr]) -> Expr:
        a, b = xs
        if op == "div":
            return kb.binary(op, a, nonzero_divisor(node, b))
        if op != "pow":
            return kb.binary(op, a, b)
        if not is_float(a.dtype):  # integer powers, computed exactly enough in float64
            wide = kb.binary("pow", kb.cast(a, "float64"), kb.cast(b, "float64"))
            return kb.cast(kb.unary("round", wide), a.dtype)
        return kb.binary("pow", a, kb.cast(b, a.dtype))

    elementwise(ctx, node, node.inputs[:2], body)


@lowers(*COMPARE)
def lower_compare(ctx: LowerContext, node: Node) -> None:
    op = COMPARE[node.op_type]
    elementwise(ctx, node, node.inputs[:2], lambda xs: kb.binary(op, *xs, dtype="bool"))


@lowers("Mod")
def lower_mod(ctx: LowerContext, node: Node) -> None:
    fmod = int(node.attr("fmod", 0))

    def body(xs: list[Expr]) -> Expr:
        a, b = xs
        return kb.binary("fmod" if fmod else "mod", a, nonzero_divisor(node, b))

    elementwise(ctx, node, node.inputs[:2], body)


@lowers("BitShift")
def lower_bitshift(ctx: LowerContext, node: Node) -> None:
    op = "shl" if node.attr("direction") == "LEFT" else "shr"
    elementwise(ctx, node, node.inputs[:2], lambda xs: kb.binary(op, *xs))


VARIADIC = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}


@lowers(*VARIADIC)
def lower_variadic(ctx: LowerContext, node: Node) -> None:
    op = VARIADIC[node.op_type]

    def body(xs: list[Expr]) -> Expr:
        total = fold(lambda a, b: kb.binary(op, a, b), xs)
        if node.op_type == "Mean":
            total = kb.binary("div", total, kb.const(len(xs), total.dtype))
        return total

    elementwise(ctx, node, [n for n in node.inputs if n], body)


@lowers("PRelu")
def lower_prelu(ctx: LowerContext, node: Node) -> None:
    def body(xs: list[Expr]) -> Expr:
        x, slope = xs
        return kb.select(kb.binary("lt", x, _zero(x), "bool"), kb.binary("mul", x, slope), x)

    elementwise(ctx, node, node.inputs[:2], body)


@lowers("Where")
def lower_where(ctx: LowerContext, node: Node) -> None:
    elementwise(ctx, node, node.inputs[:3], lambda xs: kb.select(*xs))


def _zero(x: Expr) -> Expr:
    return kb.const(0, x.dtype)
