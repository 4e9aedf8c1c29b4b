"""Scans along one axis: CumSum, CumProd, and ReverseSequence.

CumSum and CumProd are one reduction over a triangular domain (``add`` from 0, ``mul``
from 1): the output position ``i`` along the axis combines every input position ``j`` on
its side of it, so there is no loop-carried recurrence and every output element is
independent::

    S0: y[.., i, ..] = 0                                       (CumProd: = 1)
    S1: y[.., i, ..] += x[.., j, ..]    over 0 <= j <= i       (CumProd: *=)
                                        (exclusive: j < i; reverse: i <= j < n)

That is n(n+1)/2 operations per line instead of n; the axes cumulative sums and products
run over in models (positions, masks) are short. ``exclusive`` starts each line with the
identity (the empty sum or product).

ReverseSequence reads each batch entry's first ``sequence_lens[b]`` time steps backwards
(a LoadAt at a computed time index) and copies the rest.
"""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import CheckSite, Expr, Iter, LoadAt, Statement, in_range, is_float
from polyonnx.krnl.lower import LowerContext, lowers

CUMULATIVE = {"CumSum": ("add", 0), "CumProd": ("mul", 1)}
"""Cumulative op → (the reduction operator, its identity)."""


@lowers(*CUMULATIVE)
def lower_cumulative(ctx: LowerContext, node: Node) -> None:
    """CumSum or CumProd: the triangular reduction of the module docstring."""
    reduce, identity = CUMULATIVE[node.op_type]
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    where = f"{node.op_type} node {node.name!r}"
    axis_value = ctx.require_constant(node, 1, "axis")
    if axis_value.size != 1:
        raise LoweringError(f"{where}: axis must be a scalar, got shape {axis_value.shape}")
    if rank == 0:
        raise LoweringError(f"{where}: the input must have rank >= 1")
    axis = kb.normalize_axis(int(axis_value.reshape(()).item()), rank, where)
    if not (is_float(x.dtype) or x.dtype.startswith(("int", "uint"))):
        raise LoweringError(f"{where}: dtype {x.dtype} is not supported")
    exclusive, reverse = int(node.attr("exclusive", 0)), int(node.attr("reverse", 0))
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    if not x.size:
        return
    n = x.shape[axis]
    dims = kb.dims("d", rank)
    i = dims[axis]
    write = kb.access(out, "S0", dims, dims)
    init = Statement("S0", kb.box("S0", dims, x.shape), write, kb.const(identity, x.dtype))

    full = [*dims, "j"]
    first, second = (i, "j") if reverse else ("j", i)
    bounds = [f"0 <= {d} < {size}" for d, size in zip(dims, x.shape, strict=True)]
    bounds += [f"0 <= j < {n}", f"{first} {'<' if exclusive else '<='} {second}"]
    domain = f"{{ S1[{', '.join(full)}] : {' and '.join(bounds)} }}"
    read = [("j" if r == axis else d) for r, d in enumerate(dims)]
    body = kb.load(kb.access(x.name, "S1", full, read), x.dtype)
    update = Statement("S1", domain, kb.access(out, "S1", full, dims), body, reduce)
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
    steps = x.shape[time_axis]
    message = f"sequence length {{value}} is out of range [0, {steps}] ({node.inputs[1]!r})"
    length = in_range(
        kb.cast(length, "int64"), 0, steps, CheckSite(node.name, node.op_type, message)
    )
    inside = kb.binary("lt", t, length, "bool")
    back = kb.binary("sub", kb.binary("sub", length, kb.const(1, "int64")), t)
    index: list[Expr] = [Iter("int64", d) for d in dims]
    index[time_axis] = kb.select(inside, back, t)
    out = ctx.output(node.outputs[0], x.shape, x.dtype).name
    body = LoadAt(x.dtype, x.name, tuple(index))
    write = kb.access(out, "S0", dims, dims)
    ctx.kernel(node, [Statement("S0", kb.box("S0", dims, x.shape), write, body)])
