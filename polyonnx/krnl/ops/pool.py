"""Pools: MaxPool (with its optional Indices), AveragePool, LpPool, and the global
GlobalMaxPool, GlobalAveragePool, GlobalLpPool.

A windowed pool is an init statement and a reduction over (n, c, out spatial..,
kernel spatial..) whose domain holds only the taps that land inside the input, so padding
is never materialised (a padded max ignores the pad; a padded sum adds zero)::

    S0: Y[n, c, o..] = identity
    S1: Y[n, c, o..] = Y[n, c, o..] <op> f(X[n, c, s*o + d*k - p ..])
        over 0 <= s*o + d*k - p < size                   (for every spatial axis)
    S2: Y[n, c, o..] = g(Y[n, c, o..])                   (AveragePool: / count, LpPool: ^1/p)

AveragePool divides by the number of taps in the window: those inside the input
(count_include_pad=0) or inside the input and its explicit pads (count_include_pad=1;
ceil_mode's extra room past the end never counts). When that count is the same for every
window it is a literal; otherwise it is counted into a temp by a reduction of ones over the
same kind of constrained domain, without the n and c dims.

MaxPool's Indices are found after the max: the smallest row-major flat input index in the
window whose value equals the max (the first in scan order, as onnxruntime picks), turned
into a column-major index when storage_order=1.

The global pools reduce over every spatial dim with :class:`reduce.Reduction`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Access, Buffer, Expr, Iter, Statement, is_float
from polyonnx.krnl.islutil import row_major_strides
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.conv import (
    Axis,
    accumulator,
    domain,
    round_into,
    spatial_input,
    window,
)
from polyonnx.krnl.ops.reduce import Reduction, identity

Fn = Callable[[Expr], Expr]
INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass(frozen=True)
class Pooling:
    """The loop structure of a windowed pool over an N x C x D1 x ... input."""

    shape: tuple[int, ...]
    axes: tuple[Axis, ...]

    @property
    def out_dims(self) -> list[str]:
        return ["n", "c", *kb.dims("o", len(self.axes))]

    @property
    def k_dims(self) -> list[str]:
        return kb.dims("k", len(self.axes))

    @property
    def dims(self) -> list[str]:
        return [*self.out_dims, *self.k_dims]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.shape[:2], *(a.out for a in self.axes))

    def taps(self) -> list[str]:
        return [
            a.tap(o, k) for a, o, k in zip(self.axes, self.out_dims[2:], self.k_dims, strict=True)
        ]

    def window_domain(self, stmt: str) -> str:
        """Every (output, tap) pair whose tap lands inside the input."""
        inside = [
            a.inside(o, k)
            for a, o, k in zip(self.axes, self.out_dims[2:], self.k_dims, strict=True)
        ]
        shape = [*self.out_shape, *(a.kernel for a in self.axes)]
        return domain(stmt, self.dims, shape, inside)

    def out_box(self, stmt: str) -> str:
        return kb.box(stmt, self.out_dims, self.out_shape)

    def write(self, buffer: str, stmt: str, over_window: bool) -> Access:
        dims = self.dims if over_window else self.out_dims
        return kb.access(buffer, stmt, dims, self.out_dims)

    def read(self, x: Buffer, stmt: str) -> Expr:
        return kb.load(kb.access(x.name, stmt, self.dims, ["n", "c", *self.taps()]), x.dtype)

    def reduce(
        self, out: str, x: Buffer, dtype: str, op: str, f: Fn, first: int
    ) -> list[Statement]:
        """``out = identity; out <op>= f(x[tap])`` over the window's domain."""
        s_init, s_upd = f"S{first}", f"S{first + 1}"
        init = Statement(
            s_init, self.out_box(s_init), self.write(out, s_init, False), identity(op, dtype)
        )
        body = f(kb.cast(self.read(x, s_upd), dtype))
        update = Statement(s_upd, self.window_domain(s_upd), self.write(out, s_upd, True), body, op)
        return [init, update]

    def finish(self, out: str, stmt: str, dtype: str, fn: Fn) -> Statement:
        acc = self.write(out, stmt, False)
        return Statement(stmt, self.out_box(stmt), acc, fn(kb.load(acc, dtype)))


def _pooling(node: Node, x: Buffer) -> Pooling:
    spatial_input(node, x)
    kernel = node.attr("kernel_shape")
    if kernel is None or len(kernel) != len(x.shape) - 2:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: kernel_shape must give one size per spatial "
            f"axis of the input of shape {list(x.shape)}, got {kernel}"
        )
    ceil_mode = bool(int(node.attr("ceil_mode", 0)))
    axes = window(node, x.shape[2:], [int(k) for k in kernel], ceil_mode)
    return Pooling(tuple(x.shape), axes)


def _float_input(node: Node, x: Buffer) -> None:
    if not is_float(x.dtype):
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: dtype {x.dtype} is not supported (floats only)"
        )


# ---- MaxPool -------------------------------------------------------------------------------


@lowers("MaxPool")
def lower_max_pool(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    pool = _pooling(node, x)
    out = ctx.output(node.outputs[0], pool.out_shape, x.dtype)
    stmts = pool.reduce(out.name, x, x.dtype, "max", lambda e: e, 0)
    if len(node.outputs) > 1 and node.outputs[1]:
        storage_order = int(node.attr("storage_order", 0))
        indices = ctx.output(node.outputs[1], pool.out_shape, "int64")
        stmts += _argmax(pool, x, out, indices.name, storage_order)
    ctx.kernel(node, stmts)


def _argmax(
    pool: Pooling, x: Buffer, out: Buffer, indices: str, storage_order: int
) -> list[Statement]:
    """``I = min { flat index of the tap : x[tap] == Y }`` (then column-major if asked);
    a NaN max (max propagates NaN) is found at the window's first NaN."""
    spatial = pool.shape[2:]
    size = int(np.prod(spatial, dtype=np.int64))
    strides = row_major_strides(spatial)
    terms = [(pool.shape[1] * size, "n"), (size, "c")]
    offset = 0
    for a, o, k, stride in zip(pool.axes, pool.out_dims[2:], pool.k_dims, strides, strict=True):
        terms += [(a.stride * stride, o), (a.dilation * stride, k)]
        offset -= a.pad * stride
    none = kb.const(INT64_MAX, "int64")
    value = pool.read(x, "S3")
    hit = kb.binary("eq", value, kb.load(pool.write(out.name, "S3", True), out.dtype), "bool")
    if is_float(x.dtype):
        hit = kb.binary("or", hit, kb.unary("isnan", value, "bool"))
    init = Statement("S2", pool.out_box("S2"), pool.write(indices, "S2", False), none)
    found = kb.select(hit, _linear(terms, offset), none)
    update = Statement(
        "S3", pool.window_domain("S3"), pool.write(indices, "S3", True), found, "min"
    )
    if not storage_order:
        return [init, update]
    return [
        init,
        update,
        pool.finish(indices, "S4", "int64", lambda i: _column_major(i, pool, size)),
    ]


def _linear(terms: Sequence[tuple[int, str]], offset: int) -> Expr:
    """``sum coeff * dim + offset`` as an int64 expression over the statement's dims."""
    value: Expr = kb.const(offset, "int64")
    for coeff, dim in terms:
        if coeff:
            value = kb.binary(
                "add", value, kb.binary("mul", kb.const(coeff, "int64"), Iter("int64", dim))
            )
    return value


def _column_major(index: Expr, pool: Pooling, size: int) -> Expr:
    """A row-major flat index as (n*C + c)*size + the column-major spatial index."""
    spatial = pool.shape[2:]
    base = _linear([(pool.shape[1] * size, "n"), (size, "c")], 0)
    within = kb.binary("sub", index, base)
    column, scale = base, 1
    for n, stride in zip(spatial, row_major_strides(spatial), strict=True):
        coord = kb.binary(
            "mod", kb.binary("div", within, kb.const(stride, "int64")), kb.const(n, "int64")
        )
        column = kb.binary("add", column, kb.binary("mul", coord, kb.const(scale, "int64")))
        scale *= n
    return column


# ---- AveragePool, LpPool --------------------------------------------------------------------


@lowers("AveragePool")
def lower_average_pool(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    pool = _pooling(node, x)
    out = ctx.output(node.outputs[0], pool.out_shape, x.dtype)
    acc = accumulator(ctx, out)
    stmts = pool.reduce(acc.name, x, acc.dtype, "add", lambda e: e, 0)
    include_pad = bool(int(node.attr("count_include_pad", 0)))
    counts = [_tap_counts(a, include_pad) for a in pool.axes]
    if all(len(set(c.tolist())) == 1 for c in counts):
        divisor = int(np.prod([c[0] for c in counts]))
        stmts.append(
            pool.finish(
                acc.name, "S2", acc.dtype, lambda y: kb.binary("div", y, kb.const(divisor, y.dtype))
            )
        )
    else:
        count = ctx.temp(out.name + ".count", pool.out_shape[2:], acc.dtype)
        stmts += _count_taps(pool, count.name, acc.dtype, include_pad)
        divide = kb.load(kb.access(count.name, "S4", pool.out_dims, pool.out_dims[2:]), acc.dtype)
        stmts.append(pool.finish(acc.name, "S4", acc.dtype, lambda y: kb.binary("div", y, divide)))
    if acc is not out:
        stmts.append(round_into(out, acc, f"S{len(stmts)}"))
    ctx.kernel(node, stmts)


def _tap_counts(axis: Axis, include_pad: bool) -> np.ndarray:
    """How many taps of each output's window count along one axis."""
    taps = (
        axis.stride * np.arange(axis.out)[:, None]
        + axis.dilation * np.arange(axis.kernel)
        - axis.pad
    )
    low, high = (-axis.pad, axis.size + axis.pad_end) if include_pad else (0, axis.size)
    return ((taps >= low) & (taps < high)).sum(axis=1)


def _count_taps(pool: Pooling, count: str, dtype: str, include_pad: bool) -> list[Statement]:
    """``count[o..] = #taps`` as a sum of ones over the (output, tap) domain, n and c aside."""
    o, k = pool.out_dims[2:], pool.k_dims
    dims = [*o, *k]
    box = [*pool.out_shape[2:], *(a.kernel for a in pool.axes)]
    rule = Axis.in_padded if include_pad else Axis.inside
    constraints = [rule(a, oi, ki) for a, oi, ki in zip(pool.axes, o, k, strict=True)]
    init = Statement(
        "S2", kb.box("S2", o, box[: len(o)]), kb.access(count, "S2", o, o), kb.const(0, dtype)
    )
    ones = Statement(
        "S3",
        domain("S3", dims, box, constraints),
        kb.access(count, "S3", dims, o),
        kb.const(1, dtype),
        "add",
    )
    return [init, ones]


@lowers("LpPool")
def lower_lp_pool(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    pool = _pooling(node, x)
    out = ctx.output(node.outputs[0], pool.out_shape, x.dtype)
    acc = accumulator(ctx, out)
    power, root = _lp(node)
    stmts = pool.reduce(acc.name, x, acc.dtype, "add", power, 0)
    stmts.append(pool.finish(acc.name, "S2", acc.dtype, root))
    if acc is not out:
        stmts.append(round_into(out, acc, "S3"))
    ctx.kernel(node, stmts)


def _lp(node: Node) -> tuple[Fn, Fn]:
    """``|x|^p`` and ``y^(1/p)``, with p = 1 and 2 as abs and x*x / sqrt."""
    p = node.attr("p", 2)
    if p is None or float(p) <= 0:
        raise LoweringError(f"{node.op_type} node {node.name!r}: p must be positive, got {p}")
    p = float(p)
    if p == 1:
        return (lambda e: kb.unary("abs", e)), (lambda y: y)
    if p == 2:
        return (lambda e: kb.binary("mul", e, e)), (lambda y: kb.unary("sqrt", y))
    return (
        lambda e: kb.binary("pow", kb.unary("abs", e), kb.const(p, e.dtype)),
        lambda y: kb.binary("pow", y, kb.const(1.0 / p, y.dtype)),
    )


# ---- global pools ---------------------------------------------------------------------------


@lowers("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool")
def lower_global_pool(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    spatial_input(node, x)
    red = Reduction(tuple(x.shape), tuple(range(2, len(x.shape))), keepdims=True)
    out = ctx.output(node.outputs[0], red.out_shape, x.dtype)
    if node.op_type == "GlobalMaxPool":
        ctx.kernel(node, red.statements(out.name, x.name, x.dtype, "max", lambda e: e))
        return
    _float_input(node, x)
    acc = accumulator(ctx, out)
    if node.op_type == "GlobalAveragePool":
        power: Fn = lambda e: e  # noqa: E731
        finish: Fn = lambda y: kb.binary("div", y, kb.const(red.count, y.dtype))  # noqa: E731
    else:
        power, finish = _lp(node)
    body = power(kb.cast(red.read(x.name, "S1", x.dtype), acc.dtype))
    stmts = [
        Statement(
            "S0", red.out_box("S0"), red.write(acc.name, "S0", False), identity("add", acc.dtype)
        ),
        Statement(
            "S1", kb.box("S1", red.loop_dims, x.shape), red.write(acc.name, "S1", True), body, "add"
        ),
        red.finish(acc.name, "S2", acc.dtype, finish),
    ]
    if acc is not out:
        stmts.append(round_into(out, acc, "S3"))
    ctx.kernel(node, stmts)
