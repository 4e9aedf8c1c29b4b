"""Scans along one axis: CumSum, and ReverseSequence.

CumSum is a sum reduction over a triangular domain: the output position ``i`` along the
axis adds up every input position ``j`` on its side of it, so there is no loop-carried
recurrence and every output element is independent::

    S0: y[.., i, ..] = 0
    S1: y[.., i, ..] += x[.., j, ..]    over 0 <= j <= i       (exclusive: j < i;
                                                                reverse: i <= j < n)

That is n(n+1)/2 additions per line instead of n; the axes cumulative sums run over in
models (positions, masks) are short.

ReverseSequence reads each batch entry's first ``sequence_lens[b]`` time steps backwards
(a LoadAt at a computed time index) and copies the rest.
"""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Iter, LoadAt, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers


@lowers("CumSum")
def lower_cumsum(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    axis_value = ctx.require_constant(node, 1, "axis")
    if axis_value.size != 1:
        raise LoweringError(
            f"CumSum node {node.name!r}: axis must be a scalar, got shape {axis_value.shape}"
        )
    axis = int(axis_value.reshape(()).item())
    if not -rank <= axis < rank:
        raise LoweringError(
            f"CumSum node {node.name!r}: axis {axis} is out of range for an input of rank {rank}"
        )
    if x.dtype == "bool" or not (is_float(x.dtype) or x.dtype.startswith(("int", "uint"))):
        raise LoweringError(f"CumSum node {node.name!r}: dtype {x.dtype} is not supported")
    axis %= rank
    exclusive, reverse = int(node.attr("exclusive", 0)), int(node.attr("reverse", 0))
    n = x.shape[axis]
    dims = kb.dims("d", rank)
    i = dims[axis]
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    write = kb.access(out, "S0", dims, dims)
    init = Statement("S0", kb.box("S0", dims, x.shape), write, kb.const(0, x.dtype))

    full = [*dims, "j"]
    first, second = (i, "j") if reverse else ("j", i)
    bounds = [f"0 <= {d} < {size}" for d, size in zip(dims, x.shape, strict=True)]
    bounds += [f"0 <= j < {n}", f"{first} {'<' if exclusive else '<='} {second}"]
    domain = f"{{ S1[{', '.join(full)}] : {' and '.join(bounds)} }}"
    read = [("j" if r == axis else d) for r, d in enumerate(dims)]
    body = kb.load(kb.access(x.name, "S1", full, read), x.dtype)
    update = Statement("S1", domain, kb.access(out, "S1", full, dims), body, "add")
    ctx.kernel(node, [init, update])


@lowers("ReverseSequence")
def lower_reverse_sequence(ctx: LowerContext, node: Node) -> None:
    x, lens = ctx.buffer(node.inputs[0]), ctx.buffer(node.inputs[1])
    rank = len(x.shape)
    batch_axis, time_axis = int(node.attr("batch_axis", 1)), int(node.attr("time_axis", 0))
    if rank < 2 or {batch_axis, time_axis} != {0, 1}:
        raise LoweringError(
            f"ReverseSequence node {node.name!r}: needs rank >= 2 and batch_axis/time_axis "
            f"0 and 1, got rank {rank}, batch_axis={batch_axis}, time_axis={time_axis}"
        )
    if lens.shape != (x.shape[batch_axis],):
        raise LoweringError(
            f"ReverseSequence node {node.name!r}: sequence_lens has shape {lens.shape}, "
            f"expected ({x.shape[batch_axis]},)"
        )
    dims = kb.dims("d", rank)
    t = Iter("int64", dims[time_axis])
    length = kb.load(kb.access(lens.name, "S0", dims, [dims[batch_axis]]), lens.dtype)
    length = kb.cast(length, "int64")
    inside = kb.binary("lt", t, length, "bool")
    back = kb.binary("sub", kb.binary("sub", length, kb.const(1, "int64")), t)
    index: list[Expr] = [Iter("int64", d) for d in dims]
    index[time_axis] = kb.select(inside, back, t)
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    body = LoadAt(x.dtype, x.name, tuple(index))
    write = kb.access(out, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, x.shape), write, body)])
