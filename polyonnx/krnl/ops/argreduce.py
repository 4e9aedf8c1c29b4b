"""ArgMax and ArgMin: the extreme value along ``axis``, then the first (or, with
``select_last_index``, the last) position where it occurs, as two reductions::

    S0: m[..] = -inf                 (ArgMin: +inf)
    S1: m[..] = max(m[..], x[.., r, ..])
    S2: y[..] = n                    (select_last_index: -1)
    S3: y[..] = min(y[..], x[.., r, ..] == m[..] or isnan(x[.., r, ..]) ? r : n)
                                     (select_last_index: max, with -1)

max/min propagate NaN, so a slice holding a NaN has m = NaN and the index of its first
(last) NaN wins, as in numpy.
"""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Iter, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.reduce import Reduction


@lowers("ArgMax", "ArgMin")
def lower_argreduce(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    if x.dtype == "bool":
        raise LoweringError(f"{node.op_type} node {node.name!r}: bool input is not supported")
    axis = int(node.attr("axis", 0))
    if not -rank <= axis < rank:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: axis {axis} is out of range for an input of "
            f"rank {rank}"
        )
    axis %= rank
    n = x.shape[axis]
    if n == 0:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: axis {axis} of shape {x.shape} is empty; "
            "there is no index to return"
        )
    last = bool(int(node.attr("select_last_index", 0)))
    red = Reduction(x.shape, (axis,), keepdims=bool(int(node.attr("keepdims", 1))))
    out = ctx.output(node.outputs[0], red.out_shape, "int64").name
    m = ctx.temp(out + ".extreme", red.out_shape, x.dtype).name
    extreme = "max" if node.op_type == "ArgMax" else "min"
    stmts = red.statements(m, x.name, x.dtype, extreme, lambda e: e)

    xv = red.read(x.name, "S3", x.dtype)
    hit = kb.binary("eq", xv, kb.load(red.write(m, "S3", True), x.dtype), "bool")
    if is_float(x.dtype):
        hit = kb.binary("or", hit, kb.unary("isnan", xv, "bool"))
    op, sentinel = ("max", -1) if last else ("min", n)
    index = kb.select(hit, Iter("int64", red.loop_dims[axis]), _i64(sentinel))
    stmts.append(Statement("S2", red.out_box("S2"), red.write(out, "S2", False), _i64(sentinel)))
    stmts.append(
        Statement("S3", kb.box("S3", red.loop_dims, x.shape), red.write(out, "S3", True), index, op)
    )
    ctx.kernel(node, stmts)


def _i64(value: int) -> Expr:
    return kb.const(value, "int64")
