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
window it is a literal; otherwise a constant table of the outputs' counts, computed when
lowering (a window is a box, so its count is the product of its axes' counts).

MaxPool's Indices are found after the max: the smallest row-major flat input index in the
window whose value equals the max (the first in scan order, as onnxruntime picks), turned
into a column-major index when storage_order=1.

The outputs whose every tap lands inside the input (all of them without padding) skip the
reduction: one statement computes each from its whole window, the taps unrolled, so the
output is written once instead of updated tap by tap through memory (:meth:`Pooling.reduce`)::

    S0: Y[n, c, o..] = identity                            (the border outputs only)
    S1: Y[n, c, o..] <op>= f(X[..tap..])                   (the border outputs only)
    S2: Y[n, c, o..] = f(X[.. o, k=0 ..]) <op> f(X[.. o, k=1 ..]) <op> ...
        over lo <= o <= hi                                 (for every spatial axis)

A padded pool with stride 1, with short output rows (SHORT_ROW) or with too few interior
outputs (a 7x7 plane with padding 1) first copies its input into a padded temp whose pads
hold the reduction's identity; then every output is interior and one unrolled
expression, written once. With stride 1 that expression runs along the padded plane
flattened, so SIMD lanes span rows (:func:`_flat_windows`).

The global pools reduce over every spatial dim with :class:`reduce.Reduction`.
"""

from __future__ import annotations

import dataclasses
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
    affine,
    balanced,
    domain,
    flat_windows,
    padded_axes,
    padded_copy,
    plane_taps,
    round_into,
    spatial_input,
    window,
)
from polyonnx.krnl.ops.reduce import identity

Fn = Callable[[Expr], Expr]
INT64_MAX = int(np.iinfo(np.int64).max)
MAX_UNROLLED_TAPS = 32
"""The largest window computed as one unrolled expression per output (a 5x5 window is 25
taps); bigger windows are reduced tap by tap."""
MIN_INTERIOR = 0.8
"""The least share of interior outputs for which the unrolled statement pays: the border
outputs are then reduced tap by tap, scalar, and on a 7x7 or 14x14 plane with padding 1
that costs more than the whole plane tap by tap in SIMD rows (Zen 4)."""
SHORT_ROW = 16
"""Output rows up to this long are pooled through a padded copy even where enough outputs
are interior (strided pools; stride 1 always is): longer strided rows measured faster on
the interior path, on a Zen 4 (docs/measurements.md, 'Strided pools through a padded
copy')."""
MIN_SEPARATE = 3
"""The fewest taps along the innermost windowed axis for which a separable pool pays
(2x2 windows run as fast in one pass)."""


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
        """``out = identity; out <op>= f(x[tap])`` over the window's domain: for the
        interior outputs (:meth:`interior`) as one unrolled expression, for the others
        tap by tap."""
        every = tuple(range(len(self.axes)))
        inner = self.interior()
        if inner is None:
            return self.pass_statements(x, out, dtype, op, f, (), every, first)
        border = [
            f"{o} < {lo} or {o} > {hi}"
            for o, (lo, hi) in zip(self.out_dims[2:], inner, strict=True)
            if lo > 0 or hi < self.out_shape[2 + self.out_dims[2:].index(o)] - 1
        ]
        stmts: list[Statement] = []
        if border:
            stmts = self.pass_statements(x, out, dtype, op, f, (), every, first)
            s_init, s_upd = stmts[0], stmts[1]
            edge = "(" + " or ".join(border) + ")"
            window = self.window_domain(s_upd.name)
            stmts[1] = Statement(
                s_upd.name, window.replace(" }", f" and {edge} }}"), s_upd.write, s_upd.expr, op
            )
            # the interior statement writes its outputs whole: only the border starts at
            # the identity (MaxPool 3x3 s2 64x112x112 no longer writes its 800 KB twice)
            init = self.out_box(s_init.name).replace(" }", f" and {edge} }}")
            stmts[0] = dataclasses.replace(s_init, domain=init)
        s_in = f"S{first + len(stmts)}"
        dims = self.out_dims
        bounds = [f"{lo} <= {o} <= {hi}" for o, (lo, hi) in zip(dims[2:], inner, strict=True)]
        terms = []
        for taps in np.ndindex(*(a.kernel for a in self.axes)):
            index = [
                affine([(a.stride, o)], a.dilation * k - a.pad)
                for a, o, k in zip(self.axes, dims[2:], taps, strict=True)
            ]
            read = kb.load(kb.access(x.name, s_in, dims, ["n", "c", *index]), x.dtype)
            terms.append(f(kb.cast(read, dtype)))
        stmts.append(
            Statement(
                s_in,
                domain(s_in, dims, self.out_shape, bounds),
                kb.access(out, s_in, dims, dims),
                balanced(op, terms),
            )
        )
        return stmts

    def interior(self) -> list[tuple[int, int]] | None:
        """Per spatial axis, the outputs ``lo..hi`` whose every tap lands inside the input,
        or None when an axis has none, they are too few (MIN_INTERIOR) or the window is
        too big to unroll."""
        if not self.unrollable():
            return None
        found = []
        for a in self.axes:
            lo = -(-a.pad // a.stride)  # s*o - p >= 0
            hi = min(a.out - 1, (a.size - 1 + a.pad - a.dilation * (a.kernel - 1)) // a.stride)
            if hi < lo:
                return None
            found.append((lo, hi))
        inside = np.prod([hi - lo + 1 for lo, hi in found]) / np.prod(self.out_shape[2:])
        return found if inside >= MIN_INTERIOR else None

    def unrollable(self) -> bool:
        """Whether a window is small enough to be one unrolled expression."""
        return int(np.prod([a.kernel for a in self.axes])) <= MAX_UNROLLED_TAPS

    def padded(self) -> Pooling | None:
        """The same windows over the input copied into a padded temp (every tap of every
        output inside it, at ``stride*o + dilation*k``), or None when every tap already
        lands inside the input or the window is too big to unroll."""
        if not self.unrollable():
            return None
        axes = padded_axes(self.axes)
        if all(a.pad == 0 and p.size == a.size for a, p in zip(self.axes, axes, strict=True)):
            return None
        return Pooling((*self.shape[:2], *(a.size for a in axes)), axes)

    def passes(self) -> list[tuple[int, ...]] | None:
        """The axes each pass of a separable reduction handles, or None for one pass.

        Separating pays when the innermost windowed axis is strided: its taps are read a
        lane at a time, so reading every row once, contiguously, for the other axes' taps
        first leaves only that axis's few taps to gather. The first pass also takes the
        axes whose window is one tap (they only pick positions)."""
        windowed = [i for i, a in enumerate(self.axes) if a.kernel > 1]
        inner = self.axes[windowed[-1]] if windowed else None
        if len(windowed) < 2 or inner.stride == 1 or inner.kernel < MIN_SEPARATE:
            return None
        first = tuple(i for i in range(len(self.axes)) if i not in windowed[1:])
        return [first, *((i,) for i in windowed[1:])]

    def pass_shape(self, done: Sequence[int]) -> tuple[int, ...]:
        """The shape after reducing the windows of the axes ``done``: those at output
        resolution, the others still at input resolution."""
        spatial = (a.out if i in done else a.size for i, a in enumerate(self.axes))
        return (*self.shape[:2], *spatial)

    def pass_statements(
        self,
        src: Buffer,
        dst: str,
        dtype: str,
        op: str,
        f: Fn,
        done: Sequence[int],
        current: Sequence[int],
        first: int,
    ) -> list[Statement]:
        """``dst = identity; dst <op>= f(src[tap])`` reducing the windows of the axes
        ``current``, after those of ``done`` (src is at output resolution along them)::

            dst[n, c, o0, w1] max= src[n, c, 2*o0 + k0 - 1, w1]     (current = (0,))
        """
        s_init, s_upd = f"S{first}", f"S{first + 1}"
        spatial, index, k_dims, k_shape, inside = [], [], [], [], []
        for i, a in enumerate(self.axes):
            dim = f"o{i}" if i in done or i in current else f"w{i}"
            spatial.append(dim)
            if i not in current:
                index.append(dim)
                continue
            k_dims.append(f"k{i}")
            k_shape.append(a.kernel)
            index.append(a.tap(dim, f"k{i}"))
            inside.append(a.inside(dim, f"k{i}"))
        out_dims = ["n", "c", *spatial]
        out_shape = self.pass_shape([*done, *current])
        dims = [*out_dims, *k_dims]
        init = Statement(
            s_init,
            kb.box(s_init, out_dims, out_shape),
            kb.access(dst, s_init, out_dims, out_dims),
            identity(op, dtype),
        )
        read = kb.load(kb.access(src.name, s_upd, dims, ["n", "c", *index]), src.dtype)
        update = Statement(
            s_upd,
            domain(s_upd, dims, [*out_shape, *k_shape], inside),
            kb.access(dst, s_upd, dims, out_dims),
            f(kb.cast(read, dtype)),
            op,
        )
        return [init, update]

    def covers_input(self) -> bool:
        """Whether the one window there is takes every input position once: a global pool."""
        return all(
            a.out == 1 and set(range(a.size)) <= {a.dilation * k - a.pad for k in range(a.kernel)}
            for a in self.axes
        )

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


def _window_reduce(
    ctx: LowerContext, pool: Pooling, out: str, x: Buffer, dtype: str, op: str, f: Fn
) -> list[Statement]:
    """Statements S0.. reducing every window of ``x`` into ``out``: as a global pool when
    the one window covers the input, through a padded copy when few outputs are interior
    (:func:`_padded_reduce`), separably through temps when that pays
    (:meth:`Pooling.passes`), else in one pass."""
    if pool.covers_input():
        return _flat_reduce(ctx, x, out, dtype, op, f)
    if pool.padded() is not None and (
        pool.interior() is None
        or all(a.stride == 1 for a in pool.axes)
        or pool.axes[-1].out <= SHORT_ROW
    ):
        return _padded_reduce(ctx, pool, out, x, dtype, op, f)
    groups = pool.passes()
    if groups is None or pool.interior() is not None:
        return pool.reduce(out, x, dtype, op, f, 0)
    stmts: list[Statement] = []
    src, done = x, ()
    for p, group in enumerate(groups):
        shape = pool.pass_shape([*done, *group])
        last = p == len(groups) - 1
        dst = out if last else ctx.temp(f"{out}.pass{p}", shape, dtype).name
        fn = f if p == 0 else (lambda e: e)
        stmts += pool.pass_statements(src, dst, dtype, op, fn, done, group, len(stmts))
        src, done = ctx.buffer(dst), (*done, *group)
    return stmts


def _padded_reduce(
    ctx: LowerContext, pool: Pooling, out: str, x: Buffer, dtype: str, op: str, f: Fn
) -> list[Statement]:
    """Reduce the windows through a padded copy P of the input (which pools do: see
    _window_reduce). The pads hold the reduction's identity (f of it too: 0 for sums of
    f(x) = x, |x|^p), so every output's window lies inside P and is one unrolled
    expression, written once.

        S0: P[n, c, i..] = identity                  (the pad cells only)
        S1: P[n, c, i + pad ..] = X[n, c, i..]
        S2: Y[n, c, o..] = f(P[.. s*o + d*k=0 ..]) <op> f(P[.. s*o + d*k=1 ..]) <op> ...

    Tap by tap (below), a 14x14 or 7x7 plane with padding 1 has too few interior outputs
    to unroll them alone; its rows are then read, updated and stored once per tap. With
    stride 1, S2 runs along P's flattened plane (:func:`_flat_windows`); P is then stored
    flat, so that its writes and reads name one buffer (dependences are per buffer)."""
    padded = pool.padded()
    flat = len(pool.axes) > 1 and all(a.stride == 1 for a in pool.axes)
    src, copy = padded_copy(ctx, x, pool.axes, identity(op, x.dtype), f"{out}.padded", flat)
    if not flat:
        return [*copy, *padded.reduce(out, src, dtype, op, f, 2)]
    return [*copy, *_flat_windows(ctx, padded, src, out, dtype, op, f)]


def _flat_windows(
    ctx: LowerContext, padded: Pooling, src: Buffer, out: str, dtype: str, op: str, f: Fn
) -> list[Statement]:
    """A stride-1 pool over its padded copy P (stored flat): conv.flat_windows, each tap
    ``f`` of P's value, combined with ``op``."""

    def term(taps: tuple[int, ...], value: Expr) -> Expr:
        return f(kb.cast(value, dtype))

    plane, taps = plane_taps(padded.axes)
    outs = [a.out for a in padded.axes]
    return flat_windows(
        ctx, src, out, dtype, plane, outs, taps, term, lambda terms: balanced(op, terms)
    )


# ---- MaxPool -------------------------------------------------------------------------------


@lowers("MaxPool")
def lower_max_pool(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    pool = _pooling(node, x)
    out = ctx.output(node.outputs[0], pool.out_shape, x.dtype)
    stmts = _window_reduce(ctx, pool, out.name, x, x.dtype, "max", lambda e: e)
    if len(node.outputs) > 1 and node.outputs[1]:
        storage_order = int(node.attr("storage_order", 0))
        indices = ctx.output(node.outputs[1], pool.out_shape, "int64")
        stmts += _argmax(pool, x, out, indices.name, storage_order, len(stmts))
    ctx.kernel(node, stmts)


def _argmax(
    pool: Pooling, x: Buffer, out: Buffer, indices: str, storage_order: int, first: int
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
    s_init, s_upd, s_fin = (f"S{first + i}" for i in range(3))
    value = pool.read(x, s_upd)
    hit = kb.binary("eq", value, kb.load(pool.write(out.name, s_upd, True), out.dtype), "bool")
    if is_float(x.dtype):
        hit = kb.binary("or", hit, kb.unary("isnan", value, "bool"))
    init = Statement(s_init, pool.out_box(s_init), pool.write(indices, s_init, False), none)
    found = kb.select(hit, _linear(terms, offset), none)
    update = Statement(
        s_upd, pool.window_domain(s_upd), pool.write(indices, s_upd, True), found, "min"
    )
    if not storage_order:
        return [init, update]
    return [
        init,
        update,
        pool.finish(indices, s_fin, "int64", lambda i: _column_major(i, pool, size)),
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
    stmts = _window_reduce(ctx, pool, acc.name, x, acc.dtype, "add", lambda e: e)
    include_pad = bool(int(node.attr("count_include_pad", 0)))
    counts = [_tap_counts(a, include_pad) for a in pool.axes]
    if all(len(set(c.tolist())) == 1 for c in counts):
        divisor = int(np.prod([c[0] for c in counts]))
        stmts.append(
            pool.finish(
                acc.name,
                f"S{len(stmts)}",
                acc.dtype,
                lambda y: kb.binary("div", y, kb.const(divisor, y.dtype)),
            )
        )
    else:  # the windows are boxes: an output's count is the product of its axes' counts
        table = counts[0]
        for more in counts[1:]:
            table = np.multiply.outer(table, more)
        count = ctx.table(out.name + ".count", table.astype(acc.dtype))
        s_div = f"S{len(stmts)}"
        divide = kb.load(kb.access(count.name, s_div, pool.out_dims, pool.out_dims[2:]), acc.dtype)
        stmts.append(pool.finish(acc.name, s_div, acc.dtype, lambda y: kb.binary("div", y, divide)))
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


@lowers("LpPool")
def lower_lp_pool(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    _float_input(node, x)
    pool = _pooling(node, x)
    out = ctx.output(node.outputs[0], pool.out_shape, x.dtype)
    acc = accumulator(ctx, out)
    power, root = _lp(node)
    stmts = _window_reduce(ctx, pool, acc.name, x, acc.dtype, "add", power)
    stmts.append(pool.finish(acc.name, f"S{len(stmts)}", acc.dtype, root))
    if acc is not out:
        stmts.append(round_into(out, acc, f"S{len(stmts)}"))
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
    out = ctx.output(node.outputs[0], (*x.shape[:2], *(1 for _ in x.shape[2:])), x.dtype)
    if node.op_type == "GlobalMaxPool":
        ctx.kernel(node, _flat_reduce(ctx, x, out.name, x.dtype, "max", lambda e: e))
        return
    _float_input(node, x)
    acc = accumulator(ctx, out)
    if node.op_type == "GlobalAveragePool":
        count = int(np.prod(x.shape[2:], dtype=np.int64))
        power: Fn = lambda e: e  # noqa: E731
        finish: Fn = lambda y: kb.binary("div", y, kb.const(count, y.dtype))  # noqa: E731
    else:
        power, finish = _lp(node)
    stmts = _flat_reduce(ctx, x, acc.name, acc.dtype, "add", power)
    stmts.append(_flat_finish(x, acc.name, "S2", acc.dtype, finish))
    if acc is not out:
        stmts.append(round_into(out, acc, "S3"))
    ctx.kernel(node, stmts)


def _flat_reduce(
    ctx: LowerContext, x: Buffer, out: str, dtype: str, op: str, f: Fn
) -> list[Statement]:
    """``out[n, c, 0..] = identity; out[n, c, 0..] <op>= f(x[n, c, s])`` with x seen as
    N x C x (spatial size) (a view, no copy), so the reduction runs along one contiguous
    dim, in SIMD lanes, however small each spatial axis is."""
    size = int(np.prod(x.shape[2:], dtype=np.int64))
    flat = f"{x.name}.flat"
    if flat not in ctx.buffers:
        ctx.view(flat, x.name, (*x.shape[:2], size))
    at = ["n", "c", *("0" for _ in x.shape[2:])]
    dims = ["n", "c", "s"]
    init = Statement(
        "S0",
        kb.box("S0", dims[:2], x.shape[:2]),
        kb.access(out, "S0", dims[:2], at),
        identity(op, dtype),
    )
    read = kb.load(kb.access(flat, "S1", dims, dims), x.dtype)
    update = Statement(
        "S1",
        kb.box("S1", dims, (*x.shape[:2], size)),
        kb.access(out, "S1", dims, at),
        f(kb.cast(read, dtype)),
        op,
    )
    return [init, update]


def _flat_finish(x: Buffer, out: str, stmt: str, dtype: str, fn: Fn) -> Statement:
    """``out[n, c, 0..] = fn(out[n, c, 0..])``."""
    at = kb.access(out, stmt, ["n", "c"], ["n", "c", *("0" for _ in x.shape[2:])])
    return Statement(stmt, kb.box(stmt, ["n", "c"], x.shape[:2]), at, fn(kb.load(at, dtype)))
