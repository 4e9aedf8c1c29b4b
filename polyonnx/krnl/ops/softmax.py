"""Softmax and LogSoftmax as max-shifted reductions over the normalised axes.

Opset >= 13 normalises over one axis (default -1); older opsets coerce the input to 2-D
at ``axis`` (default 1) and normalise over every trailing dim::

    Softmax                              LogSoftmax
    m = max x           (over the axes)  m = max x
    y = exp(x - m)                       s = sum exp(x - m)
    s = 1 / sum y                        s = log(s)
    y = y * s                            y = (x - m) - s

The exps are ``expneg`` (emit/mathfn.py): their arguments are never above 0, so the
cheaper form applies. The max need not propagate NaN (``max_nnan``, one vmaxps a step):
a NaN in a row makes its sum NaN, so every output of that row is NaN whatever the max.
Softmax stores each exp once and multiplies by the reciprocal of the sum; LogSoftmax
never stores ``x - m``: it recomputes it in the last statement.

The reductions are plain ones along the axis: where it is the innermost, contiguous one,
the code generator's vector loop keeps four vector accumulators (``INTERLEAVE`` in
emit/codegen.py). A two-stage form with 64 partial results a row, which gave one vector
loop several accumulators before that, measured slower since (docs/measurements.md,
'Softmax's reductions').
"""

from __future__ import annotations

from collections.abc import Callable

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Statement
from polyonnx.krnl.lower import LowerContext, lowers
from polyonnx.krnl.ops.reduce import Reduction

Update = Callable[[Expr, Callable[[str], Expr]], Expr]
"""A reduction's summand from (the loaded element, a loader of per-row statistics)."""


@lowers("Softmax", "LogSoftmax")
def lower_softmax(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    where = f"{node.op_type} node {node.name!r}"
    if node.opset >= 13:
        axes = (kb.normalize_axis(node.attr("axis", -1), rank, where),) if rank else ()
    else:  # coerced to 2-D at axis: normalise over every trailing dim; axis may be rank
        axis = int(node.attr("axis", 1))
        axes = tuple(range(kb.normalize_axis(axis, rank, where), rank)) if axis != rank else ()
    red = Reduction(x.shape, axes, keepdims=True)
    dt = x.dtype
    out = ctx.output(node.outputs[0], x.shape, dt).name
    m = ctx.temp(out + ".max", red.out_shape, dt).name
    s = ctx.temp(out + ".sum", red.out_shape, dt).name
    dims = red.loop_dims
    stmts: list[Statement] = []

    def name() -> str:
        return f"S{len(stmts)}"

    def at(buffer: str, stmt: str) -> Expr:
        return kb.load(red.write(buffer, stmt, True), dt)

    def full(fn: Callable[[str], Expr], target: str) -> None:
        """``target[..] = fn(stmt)`` at every point of x."""
        stmt = name()
        write = kb.access(target, stmt, dims, dims)
        stmts.append(Statement(stmt, kb.box(stmt, dims, x.shape), write, fn(stmt)))

    def reduce(target: str, source: str, op: str, update: Update) -> None:
        """Init and update statements reducing ``update(source[..], row loader)`` into
        ``target``."""
        s_upd = f"S{len(stmts) + 1}"

        def row(buffer: str) -> Expr:
            return kb.load(red.write(buffer, s_upd, True), dt)

        stmts.extend(red.statements(target, source, dt, op, lambda e: update(e, row), len(stmts)))

    def shifted(stmt: str) -> Expr:
        return kb.binary("sub", red.read(x.name, stmt, dt), at(m, stmt))

    reduce(m, x.name, "max_nnan", lambda e, _: e)
    if node.op_type == "LogSoftmax":
        reduce(s, x.name, "add", lambda e, row: kb.unary("expneg", kb.binary("sub", e, row(m))))
        stmts.append(red.finish(s, name(), dt, lambda e: kb.unary("log", e)))
        full(lambda stmt: kb.binary("sub", shifted(stmt), at(s, stmt)), out)
    else:
        full(lambda stmt: kb.unary("expneg", shifted(stmt)), out)
        reduce(s, out, "add", lambda e, _: e)
        stmts.append(red.finish(s, name(), dt, lambda e: kb.unary("reciprocal", e)))
        full(lambda stmt: kb.binary("mul", red.read(out, stmt, dt), at(s, stmt)), out)
    ctx.kernel(node, stmts)
