"""Pad: constant, edge, reflect and wrap padding (negative pads crop).

Along axis ``r`` output index ``o`` comes from input index ``o - begin[r]``. The output
box is cut into disjoint convex pieces:

- the *interior*, where every source index is inside the input: an affine copy
  ``out[o] = x[o - begin]`` that vectorises;
- for each padded axis ``r``, a slab below and a slab above the interior along ``r``
  (interior along the axes before ``r``, anything along the axes after it). A slab
  is filled with the constant, or, for the other modes, read with a LoadAt whose index
  maps the out-of-range source index back into the input: clamped (edge), folded with
  period ``2(n - 1)`` (reflect, which numpy repeats for pads wider than the input) or
  taken modulo ``n`` (wrap).

A negative pad just shifts the source index the other way, so cropping needs no special
case: ``out = pad(x, max(pads, 0))[crop]`` with the same index map.
"""

from __future__ import annotations

import numpy as np

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Iter, LoadAt, Statement
from polyonnx.krnl.lower import LowerContext, lowers

MODES = ("constant", "edge", "reflect", "wrap")


@lowers("Pad")
def lower_pad(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    mode = node.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in MODES:
        raise LoweringError(f"Pad node {node.name!r}: unknown mode {mode!r}")
    begin, end = _pads(ctx, node, rank)
    shape = [n + b + e for n, b, e in zip(x.shape, begin, end, strict=True)]
    if min(shape, default=0) < 0:
        raise LoweringError(
            f"Pad node {node.name!r}: pads {begin + end} crop more than the input {x.shape} has"
        )
    out = ctx.output(node.outputs[0], shape, x.dtype)
    if not out.size:
        return
    padded = [r for r in range(rank) if begin[r] or end[r]]
    if mode != "constant":
        empty = [r for r in padded if x.shape[r] == 0 and (begin[r] > 0 or end[r] > 0)]
        if empty:
            raise LoweringError(
                f"Pad node {node.name!r}: {mode} padding of the empty axis {empty[0]} of "
                f"{x.shape} has nothing to copy from"
            )
    dims = kb.dims("d", rank)
    inner = [(max(b, 0), min(b + n, o)) for n, b, o in zip(x.shape, begin, shape, strict=True)]
    statements: list[Statement] = []

    def add(ranges: list[tuple[int, int]], body) -> None:
        if any(lo >= hi for lo, hi in ranges):
            return
        name = f"S{len(statements)}"
        bounds = " and ".join(
            f"{lo} <= {d} < {hi}" for d, (lo, hi) in zip(dims, ranges, strict=True)
        )
        domain = f"{{ {name}[{', '.join(dims)}] : {bounds} }}" if bounds else f"{{ {name}[] }}"
        write = kb.access(out.name, name, dims, dims)
        statements.append(Statement(name, domain, write, body(name)))

    def interior(name: str) -> Expr:
        read = [f"{d} - {b}" if b else d for d, b in zip(dims, begin, strict=True)]
        return kb.load(kb.access(x.name, name, dims, read), x.dtype)

    def border(name: str) -> Expr:
        if mode == "constant":
            return _constant(ctx, node, name, dims, x.dtype)
        index = tuple(
            _source(mode, Iter("int64", d), begin[r], x.shape[r])
            if r in padded
            else Iter("int64", d)
            for r, d in enumerate(dims)
        )
        return LoadAt(x.dtype, x.name, index)

    add(inner, interior)
    for r in padded:
        before = [*inner[:r], (0, inner[r][0]), *((0, n) for n in shape[r + 1 :])]
        after = [*inner[:r], (inner[r][1], shape[r]), *((0, n) for n in shape[r + 1 :])]
        add(before, border)
        add(after, border)
    ctx.kernel(node, statements)


def _source(mode: str, o: Expr, begin: int, n: int) -> Expr:
    """The input index that output index ``o`` copies along an axis of size ``n``."""
    i64 = "int64"
    s = kb.binary("sub", o, kb.const(begin, i64)) if begin else o
    if mode == "edge":
        low = kb.binary("max", s, kb.const(0, i64))
        return kb.binary("min", low, kb.const(n - 1, i64))
    if mode == "wrap":
        return kb.binary("mod", s, kb.const(n, i64))
    if n == 1:  # reflect
        return kb.const(0, i64)
    period = 2 * (n - 1)
    folded = kb.binary("mod", s, kb.const(period, i64))
    return kb.binary("min", folded, kb.binary("sub", kb.const(period, i64), folded))


def _constant(ctx: LowerContext, node: Node, stmt: str, dims: list[str], dtype: str) -> Expr:
    """The fill value: the ``value`` attribute before opset 11, then the optional
    ``constant_value`` input (a graph input is read at run time)."""
    if node.opset < 11:
        return kb.const(float(node.attr("value", 0.0)), dtype)
    name = node.input(2)
    if not name:
        return kb.const(0, dtype)
    buf = ctx.buffer(name)
    if buf.size != 1:
        raise LoweringError(
            f"Pad node {node.name!r}: constant_value has shape {buf.shape}, not one element"
        )
    return kb.cast(ctx.operand(name, stmt, dims), dtype)


def _pads(ctx: LowerContext, node: Node, rank: int) -> tuple[list[int], list[int]]:
    """Per-axis (begin, end) pads, from the ``pads`` attribute (opset < 11) or input,
    spread over ``axes`` (opset 18's optional input) or every axis."""
    if node.opset < 11:
        raw = node.attr("pads")
        if raw is None:
            raise LoweringError(f"Pad node {node.name!r} has no pads attribute")
        pads = [int(p) for p in raw]
    else:
        pads = [int(p) for p in np.asarray(ctx.require_constant(node, 1, "pads")).reshape(-1)]
    axes = list(range(rank))
    if node.opset >= 18 and node.input(3):
        given = np.asarray(ctx.require_constant(node, 3, "axes")).reshape(-1)
        axes = [int(a) for a in given]
        bad = [a for a in axes if not -rank <= a < rank]
        if bad:
            raise LoweringError(f"Pad node {node.name!r}: axes {bad} out of range for rank {rank}")
        axes = [a % rank for a in axes]
        if len(set(axes)) != len(axes):
            raise LoweringError(f"Pad node {node.name!r}: repeated axes {axes}")
    if len(pads) != 2 * len(axes):
        raise LoweringError(
            f"Pad node {node.name!r}: {len(pads)} pads for {len(axes)} axes (need {2 * len(axes)})"
        )
    begin, end = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begin[axis], end[axis] = pads[i], pads[len(axes) + i]
    return begin, end
