"""Ops that make values from positions: Range, ConstantOfShape, EyeLike, Trilu, OneHot.

Shapes come from compile-time values (a graph input there is specialised on by the
session); the values are constants and the Iter of the domain dims. Where a value
differs between regions of the output (EyeLike's diagonal, Trilu's triangle), each region
is its own statement over an affine domain (``j = i + k``, ``j >= i + k``), not a
Select evaluated at every point.
"""

from __future__ import annotations

import math

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Iter, Statement, is_float
from polyonnx.krnl.islutil import parse_set
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.constant import constant_scalar
from polyonnx.krnl.ops.elementwise import ONNX_DTYPES


def _statement(name: str, domain: str, out: str, dims: list[str], body: Expr) -> Statement:
    return Statement(name, domain, kb.access(out, name, dims, dims), body)


def _region(name: str, dims: list[str], shape, extra: str) -> str | None:
    """The box of ``shape`` cut by the affine constraint ``extra``; None if empty."""
    bounds = [f"0 <= {d} < {n}" for d, n in zip(dims, shape, strict=True)]
    domain = f"{{ {name}[{', '.join(dims)}] : {' and '.join([*bounds, extra])} }}"
    return None if parse_set(domain).is_empty() else domain


# ---- Range and ConstantOfShape -------------------------------------------------------


@lowers("Range")
def lower_range(ctx: LowerContext, node: Node) -> None:
    """``out[i] = start + i * delta`` for ``max(ceil((limit - start) / delta), 0)`` values
    (floats computed in float64, then rounded once to the output type)."""
    start = constant_scalar(ctx, node, 0, "start")
    limit = constant_scalar(ctx, node, 1, "limit")
    delta = constant_scalar(ctx, node, 2, "delta")
    dtype = start.dtype.name
    if delta == 0:
        raise LoweringError(f"Range node {node.name!r}: delta is 0")
    if is_float(dtype):
        count = math.ceil((float(limit) - float(start)) / float(delta))
    else:
        count = -(-(int(limit) - int(start)) // int(delta))
    count = max(count, 0)
    out = ctx.output(node.outputs[0], [count], dtype)
    if not count:
        return
    wide = "float64" if is_float(dtype) else "int64"
    step = kb.binary("mul", kb.cast(Iter("int64", "i"), wide), kb.const(delta.item(), wide))
    body = kb.cast(kb.binary("add", kb.const(start.item(), wide), step), dtype)
    ctx.kernel(node, [_statement("S0", kb.box("S0", ["i"], [count]), out.name, ["i"], body)])


@lowers("ConstantOfShape")
def lower_constant_of_shape(ctx: LowerContext, node: Node) -> None:
    shape = [int(n) for n in np.asarray(ctx.require_constant(node, 0, "shape")).reshape(-1)]
    if min(shape, default=0) < 0:
        raise LoweringError(f"ConstantOfShape node {node.name!r}: negative dim in {shape}")
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    out = ctx.output(node.outputs[0], shape, value.dtype.name)
    if not out.size:
        return
    dims = kb.dims("d", len(shape))
    body = kb.const(value.reshape(-1)[0].item(), out.dtype)
    ctx.kernel(node, [_statement("S0", kb.box("S0", dims, shape), out.name, dims, body)])


# ---- EyeLike and Trilu ---------------------------------------------------------------


@lowers("EyeLike")
def lower_eye_like(ctx: LowerContext, node: Node) -> None:
    """Zeros, then ones on the diagonal ``j = i + k`` (a one-dimensional domain)."""
    x = ctx.buffer(node.inputs[0])
    if len(x.shape) != 2:
        raise LoweringError(f"EyeLike node {node.name!r}: input must be 2-D, is {x.shape}")
    code = node.attr("dtype")
    dtype = x.dtype if code is None else ONNX_DTYPES.get(int(code))
    if dtype is None:
        raise LoweringError(f"EyeLike node {node.name!r}: unsupported dtype {code}")
    k = int(node.attr("k", 0))
    out = ctx.output(node.outputs[0], x.shape, dtype)
    if not out.size:
        return
    dims = ["i", "j"]
    statements = [_statement("S0", kb.box("S0", dims, x.shape), out.name, dims, kb.const(0, dtype))]
    diagonal = _region("S1", dims, x.shape, f"j = i + {k}")
    if diagonal:
        statements.append(_statement("S1", diagonal, out.name, dims, kb.const(1, dtype)))
    ctx.kernel(node, statements)


@lowers("Trilu")
def lower_trilu(ctx: LowerContext, node: Node) -> None:
    """The kept triangle (``j >= i + k`` upper, ``j <= i + k`` lower) is a copy, the other
    one zeros: two statements over complementary domains."""
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    if rank < 2:
        raise LoweringError(f"Trilu node {node.name!r}: input must be at least 2-D, is {x.shape}")
    k = int(constant_scalar(ctx, node, 1, "k")) if node.input(1) else 0
    upper = bool(int(node.attr("upper", 1)))
    out = ctx.output(node.outputs[0], x.shape, x.dtype)
    if not out.size:
        return
    dims = [*kb.dims("d", rank - 2), "i", "j"]
    keep, drop = (">=", "<") if upper else ("<=", ">")
    statements = []
    kept = _region("S0", dims, x.shape, f"j {keep} i + {k}")
    if kept:
        read = kb.load(kb.access(x.name, "S0", dims, dims), x.dtype)
        statements.append(_statement("S0", kept, out.name, dims, read))
    name = f"S{len(statements)}"
    zeroed = _region(name, dims, x.shape, f"j {drop} i + {k}")
    if zeroed:
        statements.append(_statement(name, zeroed, out.name, dims, kb.const(0, x.dtype)))
    ctx.kernel(node, statements)


# ---- OneHot --------------------------------------------------------------------------


@lowers("OneHot")
def lower_one_hot(ctx: LowerContext, node: Node) -> None:
    """``out[..., d, ...] = on if index[...] == d else off``, with negative indices counted
    from ``depth`` and any other out-of-range index matching nothing."""
    indices = ctx.buffer(node.inputs[0])
    values = ctx.buffer(node.inputs[2])
    depth = int(constant_scalar(ctx, node, 1, "depth").item())
    if depth < 0:
        raise LoweringError(f"OneHot node {node.name!r}: negative depth {depth}")
    if values.shape != (2,):
        raise LoweringError(
            f"OneHot node {node.name!r}: values must be [off, on], has shape {values.shape}"
        )
    rank = len(indices.shape) + 1
    axis = int(node.attr("axis", -1))
    if not -rank <= axis < rank:
        raise LoweringError(f"OneHot node {node.name!r}: axis {axis} out of range for rank {rank}")
    axis %= rank
    shape = [*indices.shape[:axis], depth, *indices.shape[axis:]]
    out = ctx.output(node.outputs[0], shape, values.dtype)
    if not out.size:
        return
    dims = kb.dims("d", rank)
    where = [*dims[:axis], *dims[axis + 1 :]]
    index = kb.cast(kb.load(kb.access(indices.name, "S0", dims, where), indices.dtype), "int64")
    negative = kb.binary("lt", index, kb.const(0, "int64"), "bool")
    index = kb.select(negative, kb.binary("add", index, kb.const(depth, "int64")), index)
    hit = kb.binary("eq", index, Iter("int64", dims[axis]), "bool")

    def value(position: int) -> Expr:
        return kb.load(kb.access(values.name, "S0", dims, [str(position)]), values.dtype)

    body = kb.select(hit, value(1), value(0))
    ctx.kernel(node, [_statement("S0", kb.box("S0", dims, shape), out.name, dims, body)])
